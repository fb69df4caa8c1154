"""The answer to "how much of this prompt does each candidate pod already hold?"."""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from indexer.block import PrefixStore, tier_from_masks
from indexer.types import Tier

if TYPE_CHECKING:
    from indexer.native import HeldFromEnds, Native

_GPU, _CPU, _STORAGE, _EXPECTED = Tier.GPU, Tier.CPU, Tier.STORAGE, Tier.EXPECTED


class TierScan:
    """The matched blocks that some pod holds off-GPU or merely expects, as (block index,
    tier masks) pairs, scanned from the store on first use: a decision on a GPU-only fleet
    (the common case) asks only whether any matched block must be loaded from CPU or
    STORAGE, which the store answers without a scan (`PrefixStore.offloaded`).

    A pod's answers hold until its own entries change: the router's entries for the pod
    a request is sent to change only blocks past that pod's match."""

    __slots__ = ("_held", "_off_gpu", "_offloaded", "_tiered", "_tiers")

    def __init__(self, tiers: Mapping[int, list[int]] | None, held: Sequence[int]) -> None:
        self._tiers = tiers
        self._held = held
        self._tiered: tuple[tuple[int, tuple[int, ...]], ...] = ()
        self._off_gpu = 0
        self._offloaded = 0

    def _scan(self) -> None:
        tiers, self._tiers = self._tiers, None
        if not tiers:
            return
        held = self._held
        if tiers.keys().isdisjoint(held):
            return
        tiered: list[tuple[int, tuple[int, ...]]] = []
        off_gpu = offloaded = 0
        for index, gw_hash in enumerate(held):
            block_masks = tiers.get(gw_hash)
            if block_masks is not None:
                tiered.append((index, tuple(block_masks)))
                loaded = (block_masks[_CPU] | block_masks[_STORAGE]) & ~block_masks[_GPU]
                off_gpu |= (loaded | block_masks[_EXPECTED]) & ~block_masks[_GPU]
                offloaded |= loaded
        self._tiered, self._off_gpu, self._offloaded = tuple(tiered), off_gpu, offloaded

    @property
    def tiered(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        if self._tiers is not None:
            self._scan()
        return self._tiered

    @property
    def off_gpu(self) -> int:
        """Pods (bits) holding some tiered block off-GPU or merely expecting it."""
        if self._tiers is not None:
            self._scan()
        return self._off_gpu

    @property
    def offloaded(self) -> int:
        """Of those, the pods that may hold some matched block on CPU or STORAGE but not on
        GPU: the blocks that cost a load to reuse."""
        if self._tiers is not None:
            self._scan()
        return self._offloaded


_NO_TIERS = TierScan(None, ())


@dataclass(slots=True)  # not frozen: one per decision, and a frozen __init__ costs 2.4×
class MatchResult:
    """Per candidate pod, the number of consecutive prompt blocks it holds from the start.
    Read-only once built.

    Tiers are resolved lazily (`TierScan`): only blocks that some pod holds off-GPU (or
    merely expects) are recorded, as (block index, tier masks) pairs; every other matched
    block is on GPU for every pod that holds it.
    """

    prompt_blocks: int
    blocks: Mapping[str, int]
    _bits: Mapping[str, int] = field(default_factory=dict, repr=False)
    _scan: TierScan = field(default=_NO_TIERS, repr=False)
    _offloaded: int = field(default=0, repr=False)
    """The pods that may hold some matched block on CPU or STORAGE but not on GPU (known
    at the match: every decision asks)."""

    @property
    def _tiered(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        return self._scan.tiered

    @property
    def _off_gpu(self) -> int:
        return self._scan.off_gpu

    def matched(self, pod: str) -> int:
        return self.blocks.get(pod, 0)

    @property
    def has_tiers(self) -> bool:
        """Whether any matched block sits off-GPU (or is only expected) for some pod."""
        return bool(self._tiered)

    def ratio(self, pod: str) -> float:
        """Matched share of the prompt's blocks (0.0 for an empty prompt)."""
        if self.prompt_blocks == 0:
            return 0.0
        return self.matched(pod) / self.prompt_blocks

    @property
    def off_gpu(self) -> bool:
        """Whether some pod's matched blocks may sit off-GPU (or only be expected): when
        False, `tiered` is False for every pod and `blocks` is the whole answer."""
        return bool(self._off_gpu)

    @property
    def offloaded(self) -> bool:
        """Whether some pod may hold a matched block on CPU or STORAGE and not on GPU: when
        False, every matched block is on GPU or expected there (both free to reuse), and
        `blocks` says what each pod saves."""
        return bool(self._offloaded)

    def offloaded_for(self, pod: str) -> bool:
        """Whether `pod` may hold some matched block on CPU or STORAGE and not on GPU; False
        means it holds none (its matched blocks are on GPU or expected there)."""
        return bool(self._offloaded & self._bits.get(pod, 0))

    def longest(self) -> int:
        """The most blocks any candidate matched."""
        blocks = self.blocks
        if type(blocks) is MatchedBlocks:
            return blocks.longest()
        return max(blocks.values(), default=0)

    def held_tokens(self, names: list[str] | tuple[str, ...], scale: float) -> list[float]:
        """Per name, in order: its matched blocks × `scale` (tokens per block), 0.0 when
        unmatched or not a candidate."""
        blocks = self.blocks
        if type(blocks) is MatchedBlocks:
            return blocks.held(names, scale)
        return [blocks.get(name, 0) * scale for name in names]

    def lengths(self) -> Mapping[str, int]:
        """`blocks` as a plain mapping (candidate -> matched blocks), resolved once: for a
        caller that reads every candidate's length."""
        blocks = self.blocks
        return blocks.table() if type(blocks) is MatchedBlocks else blocks

    def tiered(self, pod: str) -> bool:
        """Whether some matched block of `pod` may sit off-GPU (or only be expected);
        False means every block `pod` matched is on its GPU (`tier_counts` is trivial)."""
        return bool(self._off_gpu & self._bits.get(pod, 0))

    def tiers(self, pod: str) -> list[Tier]:
        """The tier of each matched block of `pod`, in prompt order."""
        count = self.matched(pod)
        tiers = [Tier.GPU] * count
        bit = self._bits.get(pod, 0)
        for index, masks in self._tiered:
            if index >= count:
                break
            tiers[index] = tier_from_masks(masks, bit)
        return tiers

    def tier_counts(self, pod: str) -> dict[Tier, int]:
        """How many matched blocks of `pod` sit in each tier."""
        counts = dict.fromkeys(Tier, 0)
        count = self.matched(pod)
        counts[Tier.GPU] = count
        bit = self._bits.get(pod, 0)
        if not self._off_gpu & bit:
            return counts
        for index, masks in self._tiered:
            if index >= count:
                break
            tier = tier_from_masks(masks, bit)
            if tier is not Tier.GPU:
                counts[Tier.GPU] -= 1
                counts[tier] += 1
        return counts

    def best(self) -> tuple[str, int] | None:
        """The pod with the longest match (first in candidate order on ties), if any."""
        best: tuple[str, int] | None = None
        for pod, count in self.blocks.items():
            if count and (best is None or count > best[1]):
                best = (pod, count)
        return best


@dataclass(frozen=True, slots=True)
class IndexStats:
    """Sizes and counters of a `SyncPrefixHashTable`."""

    pods: int
    contexts: int
    blocks: int
    """Distinct gateway blocks over all contexts."""
    pairs: int
    """(pod, gateway block) pairs held in a real tier."""
    engine_entries: int
    """Engine hashes indexed over all pods and tiers."""
    expected: int
    """Router-side (expected) entries."""
    broken_chain_events: int
    broken_chain_blocks: int
    rejected_blocks: Mapping[str, int]
    """Blocks of BlockStored events not inserted, by reason."""
    unknown_removals: int
    """BlockRemoved hashes the pod was not known to hold."""
    remapped: int
    """Engine hashes re-stored with different content (the old mapping was replaced)."""
    evicted_blocks: int
    evicted_contexts: int
    expired_expected: int
    eviction_runs: int


Spread = Callable[[dict[str, int], list[str | None], list[tuple[int, int]]], bool]
"""`_native.spread_ends`: `MatchedBlocks.table`'s bit loop in C."""


class Candidates:
    """A candidate list as `match` uses it, resolved once per distinct list (the table
    remembers it until a pod's bit changes): name -> pod bit (0 for an unknown pod), the
    inverse for the known bits, by bit index too, and the OR of the bits."""

    __slots__ = ("alive", "bits", "by_bit", "by_index", "held", "spread")

    def __init__(self, bits: dict[str, int], native: Native | None) -> None:
        self.bits = bits
        self.by_bit = {bit: name for name, bit in bits.items() if bit}
        alive = 0
        for bit in self.by_bit:
            alive |= bit
        self.alive = alive
        self.by_index: list[str | None] = [None] * alive.bit_length()
        for bit, name in self.by_bit.items():
            self.by_index[bit.bit_length() - 1] = name
        # None on the pure-Python path
        self.spread: Spread | None = None if native is None else native.spread_ends
        self.held: HeldFromEnds | None = None if native is None else native.held_from_ends


class MatchedBlocks(Mapping[str, int]):
    """Candidate pod -> matched blocks, resolved on lookup from the walk's ends.

    A match costs the same whatever the number of candidates: the walk keeps one mask,
    and each pod's length is found only when asked for (the first end whose mask has the
    pod's bit; with many distinct ends, or when every length is wanted, the whole table is
    built once, in time proportional to the pods that matched something).
    """

    __slots__ = ("_bits", "_candidates", "_ends", "_table")

    def __init__(self, candidates: Candidates, ends: list[tuple[int, int]]) -> None:
        self._candidates = candidates
        self._bits = candidates.bits
        self._ends = ends  # (matched length, mask of the pods that stop there), ascending
        self._table: dict[str, int] | None = None

    def longest(self) -> int:
        """The longest candidate's length (0 when none matched): the last end's."""
        ends = self._ends
        return ends[-1][0] if ends else 0

    def __getitem__(self, pod: str) -> int:
        bit = self._bits[pod]
        if self._table is not None:
            return self._table[pod]
        ends = self._ends
        if len(ends) > _SCAN_ENDS:
            return self.table()[pod]
        for length, mask in ends:
            if mask & bit:
                return length
        return 0

    def get(self, pod: str, default: int | None = None) -> int | None:  # type: ignore[override]
        if pod not in self._bits:
            return default
        return self[pod]

    def __contains__(self, pod: object) -> bool:
        return pod in self._bits

    def __iter__(self) -> Iterator[str]:
        return iter(self._bits)

    def __len__(self) -> int:
        return len(self._bits)

    def __repr__(self) -> str:
        return repr(dict(self.items()))

    def table(self) -> dict[str, int]:
        """Every candidate's length (built once, then shared: do not change it)."""
        table = self._table
        if table is None:
            table = self._table = dict.fromkeys(self._bits, 0)
            candidates, ends = self._candidates, self._ends
            spread = candidates.spread
            if not ends or (spread is not None and spread(table, candidates.by_index, ends)):
                return table
            by_bit = candidates.by_bit
            for length, mask in ends:
                if not length:
                    continue
                while mask:
                    low = mask & -mask
                    table[by_bit[low]] = length
                    mask ^= low
        return table

    def held(self, names: list[str] | tuple[str, ...], scale: float) -> list[float]:
        """Per name, its matched blocks × `scale` (0.0 when unmatched or unknown): read
        from the walk's ends without building the table, when compiled."""
        held = self._candidates.held
        if self._table is None and held is not None:
            found = held(self._bits, self._ends, names, scale)
            if found is not None:
                return found
        table = self.table()
        return [table.get(name, 0) * scale for name in names]

    def items(self) -> ItemsView[str, int]:
        return self.table().items()

    def values(self) -> ValuesView[int]:
        return self.table().values()


_SCAN_ENDS = 4
"""Up to this many distinct match lengths a lookup scans them; beyond, it builds a table."""


def match_prefix(
    store: PrefixStore | None, candidates: Candidates, prefix_hashes: Sequence[int], now: float
) -> MatchResult:
    """For each candidate, how many blocks of `store` from the prompt's start it holds.

    Walks the prompt's blocks once, keeping the mask of candidates still matching (an int
    AND per block), and stops as soon as none is.
    """
    total = len(prefix_hashes)
    bits, alive = candidates.bits, candidates.alive
    if store is None or alive == 0 or not total:
        return MatchResult(total, MatchedBlocks(candidates, []), bits)
    store.last_access = now
    ends = store.walk(prefix_hashes, alive, now)
    held = prefix_hashes[: ends[-1][0]]
    scan = TierScan(store.tiers, held) if store.tiers else _NO_TIERS
    offloaded = store.offloaded
    return MatchResult(
        total,
        MatchedBlocks(candidates, ends),
        bits,
        scan,
        scan.offloaded if offloaded and not offloaded.isdisjoint(held) else 0,
    )
