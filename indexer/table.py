"""The sync prefix-hash table: which pod holds which prompt prefix, fleet-wide.

ModelContext -> PrefixStore (gateway hash -> holder bit mask, plus per-tier masks for
the few blocks held off-GPU, and last access: plain ints in dicts, no object per block);
per pod, engine hash -> gateway hash(es) for each tier. Engine hashes are
opaque and per pod; the gateway computes its own chained hashes from the events' token
ids, so one prompt hashes the same whatever pod (or engine kind) holds it.

This class is the public face and owns the pod registry (one bit per pod); the work is
done by collaborators sharing its state explicitly: `Holdings` (pod bits on blocks),
`Ingest` (events and restored snapshots), `ExpectedEntries` (router-side entries),
`Evictor` (caps and expiry), `match_prefix` and the read views of `pod_views`.

Pure and synchronous: no I/O, no locks — the owner calls it from one thread (the
gateway's event loop). Time comes from the injected clock.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial

from indexer import pod_views
from indexer.block import CompiledStore, PrefixStore
from indexer.config import IndexConfig
from indexer.eviction import Evictor
from indexer.expected import ExpectedEntries
from indexer.hashing import PrefixHasher
from indexer.holdings import Holdings
from indexer.ingest import Ingest
from indexer.match import Candidates, IndexStats, MatchResult, match_prefix
from indexer.native import BlockMap, load_native
from indexer.pod import IndexedPod, Target
from indexer.snapshot import PodIndexState
from indexer.types import (
    EngineHash,
    ModelContext,
    StoredBlocksEvent,
    Tier,
    UnknownPodError,
)

_CANDIDATE_LISTS = 256
"""Distinct candidate lists remembered by `match` (a fleet has a handful: per model, per
health state); past this many the memory is simply cleared."""


class SyncPrefixHashTable:
    """Fleet-wide prefix index fed by KV events (see module docstring)."""

    def __init__(
        self,
        config: IndexConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or IndexConfig()
        native = self._native = load_native(self.config.pure_python)
        self.hasher = PrefixHasher(
            self.config.block_size, self.config.hash_seed, pure_python=native is None
        )
        limits = self._limits = self.config.limits
        self._clock = clock
        self._stores: dict[ModelContext, PrefixStore] = {}
        self._pods: dict[str, IndexedPod] = {}
        self._by_bit: dict[int, IndexedPod] = {}
        self._free_bits: list[int] = []
        self._next_bit_index = 0
        self._epochs = 0  # source of IndexedPod.epoch: bumped on every registration and clear
        self._candidates: dict[tuple[str, ...], Candidates] = {}
        """Candidate lists seen by `match`, resolved; emptied whenever a pod's bit changes,
        so a match does not rebuild them for every request."""
        self._holdings = Holdings(self._by_bit)
        self._expected = ExpectedEntries(self._pods, self._holdings, limits.max_expected_per_pod)
        new_store: Callable[[ModelContext, float], PrefixStore] = PrefixStore
        new_map: Callable[[], BlockMap[EngineHash, Target]] = dict[EngineHash, Target]
        if native is not None:
            new_store = partial(CompiledStore, native=native)
            new_map = native.map_type
        self._new_map = new_map
        self._evictor = Evictor(
            limits, new_store, self._stores, self._pods, self._holdings, self._expected, clock()
        )
        self._ingest = Ingest(self.hasher, limits, self._holdings, self._evictor, native)

    # -- pods ---------------------------------------------------------------------------

    def register_pod(
        self,
        pod: str,
        model: str,
        *,
        publishes_events: bool = True,
        lora_names: Mapping[int, str] | None = None,
    ) -> None:
        """Start indexing `pod`. Re-registering with another model drops what it had."""
        state = self._pods.get(pod)
        if state is not None and state.model != model:
            self.remove_pod(pod)
            state = None
        if state is not None:
            state.publishes_events = publishes_events
            state.lora_names = dict(lora_names or {})
            return
        if self._free_bits:
            index = heapq.heappop(self._free_bits)
        else:
            index = self._next_bit_index
            self._next_bit_index += 1
        state = IndexedPod(
            pod,
            1 << index,
            model,
            publishes_events=publishes_events,
            lora_names=lora_names or {},
            new_map=self._new_map,
        )
        self._pods[pod] = state
        self._by_bit[state.bit] = state
        self._candidates.clear()
        self._epochs += 1
        state.epoch = self._epochs

    def remove_pod(self, pod: str) -> None:
        """Forget `pod` entirely, in time proportional to what it held."""
        state = self._pods.pop(pod, None)
        if state is None:
            return
        self._clear_state(state)
        del self._by_bit[state.bit]
        self._candidates.clear()
        heapq.heappush(self._free_bits, state.bit.bit_length() - 1)

    @property
    def compiled(self) -> bool:
        """Whether this table runs on the compiled primitives (else pure Python)."""
        return self._native is not None

    def pods(self) -> list[str]:
        return list(self._pods)

    def has_pod(self, pod: str) -> bool:
        return pod in self._pods

    def pod_epoch(self, pod: str) -> int:
        """Changes whenever the pod is (re-)registered or all its blocks are dropped
        (AllBlocksCleared, an engine restart, a lost event stream): whatever the engine
        held before, such as pins, may be gone."""
        return self._state(pod).epoch

    # -- events -------------------------------------------------------------------------

    def apply_stored(self, pod: str, event: StoredBlocksEvent) -> int:
        """Index a BlockStored event of `pod`; returns how many engine blocks were applied.

        A block whose parent this pod is not known to hold is a broken chain: its gateway
        hash cannot be computed, so the event is counted and not inserted (never re-rooted).
        """
        state = self._state(pod)
        now = self._clock()
        self._evictor.tick(now)
        state.generation += 1
        return self._ingest.stored(state, event, now)

    def apply_removed(
        self, pod: str, block_hashes: Iterable[EngineHash], medium: str | None = None
    ) -> int:
        """Apply a BlockRemoved of `pod`; returns how many hashes it was known to hold.

        Only this pod is touched, and a hash it holds several copies of stays until the
        last copy goes.
        """
        state = self._state(pod)
        self._evictor.tick(self._clock())
        state.generation += 1
        return self._ingest.removed(state, block_hashes, medium)

    def apply_cleared(self, pod: str) -> None:
        """Apply AllBlocksCleared: the pod holds nothing any more (router-side entries too)."""
        state = self._state(pod)
        self._evictor.tick(self._clock())
        state.generation += 1
        self._clear_state(state)

    # -- router-side entries --------------------------------------------------------------

    def add_prefix(
        self,
        pod: str,
        context: ModelContext,
        prefix_hashes: Sequence[int],
        ttl: float | None = None,
    ) -> int:
        """Record that `pod` is expected to hold these gateway blocks (a routing decision).

        Blocks the pod already holds for real are skipped. Entries expire after `ttl` —
        by default `expected_ttl_s` for pods that publish events (a BlockStored should
        confirm them well before) and `eviction_duration_s` for pods that do not (their
        approximate index) — and the oldest go when a pod has too many. Returns the number
        of expected entries added or refreshed.
        """
        state = self._state(pod)
        now = self._clock()
        evictor = self._evictor
        evictor.tick(now)
        limits = self._limits
        if ttl is None:
            ttl = limits.expected_ttl_s if state.publishes_events else limits.eviction_duration_s
        store = evictor.store_for(context, now)
        refreshed = self._expected.add(state, store, prefix_hashes, now + ttl, now)
        store.last_access = now
        if len(store.held) > limits.max_prefixes_per_context:
            evictor.trim(store)
        self._expected.compact_if_sparse()
        return refreshed

    def expected_headroom(self, pod: str, context: ModelContext, *, keep: float = 0.0) -> int:
        """How many new router-side entries `pod` can take in `context` with nothing
        evicted to make room — no other context, no block of the context, none of the
        pod's own entries — and `keep` (a fraction) of each of those caps still free."""
        state = self._state(pod)
        limits = self._limits
        share = 1.0 - keep
        store = self._stores.get(context)
        if store is None and len(self._stores) + 1 > limits.max_contexts * share:
            return 0
        blocks = int(limits.max_prefixes_per_context * share) - (
            0 if store is None else len(store.held)
        )
        entries = int(limits.max_expected_per_pod * share) - len(state.expected)
        return max(0, min(blocks, entries))

    # -- queries --------------------------------------------------------------------------

    def prefix_hashes(self, token_ids: Sequence[int]) -> list[int]:
        return self.hasher.prefix_hashes(token_ids)

    def match(
        self,
        context: ModelContext,
        prefix_hashes: Sequence[int],
        candidate_pods: Iterable[str],
    ) -> MatchResult:
        """For each candidate, how many blocks from the prompt's start it holds.

        Walks the prompt's blocks once, keeping the mask of candidates still matching, and
        stops as soon as none is.
        """
        now = self._clock()
        self._evictor.tick(now)
        key = candidate_pods if type(candidate_pods) is tuple else tuple(candidate_pods)
        found = self._candidates.get(key)
        if found is None:
            found = self._candidate_bits(key)
        return match_prefix(self._stores.get(context), found, prefix_hashes, now)

    def dump(self, pod: str) -> set[EngineHash]:
        """Engine hashes the index believes `pod` holds, in any tier."""
        return pod_views.held_hashes(self._state(pod))

    def dump_tiers(self, pod: str) -> dict[Tier, set[EngineHash]]:
        """Engine hashes the index believes `pod` holds, per real tier."""
        return pod_views.held_hashes_by_tier(self._state(pod))

    def engine_blocks(
        self, pod: str, context: ModelContext, token_ids: Sequence[int]
    ) -> list[tuple[EngineHash, Tier]]:
        """The engine hashes of `pod` that hold the longest prefix of `token_ids` it holds
        in a real tier, each once with its best tier, in prompt order (what a pin call
        needs).

        Engine blocks of k gateway blocks count when all k are in the prefix; engine blocks
        smaller than a gateway block (partials) count when their tokens are the prompt's,
        including those past the last full gateway block the pod holds. Costs one pass over
        the pod's engine entries: meant for pin calls, not for every request.
        """
        state = self._state(pod)
        store = self._stores.get(context)
        if store is None:
            return []
        return pod_views.engine_blocks(state, store, self.hasher, token_ids)

    def held_tiers(self, pod: str, engine_hashes: Iterable[EngineHash]) -> dict[EngineHash, Tier]:
        """Of these engine hashes, the ones the index believes `pod` holds in a real tier,
        each with its best tier."""
        return pod_views.held_tiers(self._state(pod), engine_hashes)

    def pod_generation(self, pod: str) -> tuple[int, int]:
        """Changes whenever the pod's indexed blocks may have changed (an event applied, a
        clear, a new registration): a caller that remembers it can skip re-reading them."""
        state = self._state(pod)
        return (state.epoch, state.generation)

    def held_blocks(self, pod: str) -> int:
        """Engine blocks (and partial blocks) the index holds for `pod`, all tiers."""
        state = self._state(pod)
        return sum(map(len, state.entries)) + sum(map(len, state.partials))

    def rejected_blocks(self, pod: str) -> dict[str, int]:
        """Blocks of this pod's BlockStored events not indexed, by reason (broken_chain...),
        since it was registered."""
        return dict(self._state(pod).rejected)

    def stats(self) -> IndexStats:
        self._expected.expire(self._clock())
        holdings, ingest, evictor = self._holdings, self._ingest, self._evictor
        return IndexStats(
            pods=len(self._pods),
            contexts=len(self._stores),
            blocks=sum(len(store.held) for store in self._stores.values()),
            pairs=holdings.pairs,
            engine_entries=sum(state.size for state in self._pods.values()),
            expected=holdings.expected_count,
            broken_chain_events=ingest.broken_events,
            broken_chain_blocks=ingest.rejected["broken_chain"],
            rejected_blocks=dict(ingest.rejected),
            unknown_removals=ingest.unknown_removals,
            remapped=ingest.remapped,
            evicted_blocks=evictor.evicted_blocks,
            evicted_contexts=evictor.evicted_contexts,
            expired_expected=self._expected.expired,
            eviction_runs=evictor.runs,
        )

    # -- snapshots ------------------------------------------------------------------------

    def export_pod(self, pod: str) -> PodIndexState:
        """What `pod` holds for real (router-side entries excluded), for `restore_pod` —
        in a snapshot file, a later process or another replica."""
        return pod_views.export_entries(self._state(pod))

    def restore_pod(self, pod: str, index: PodIndexState) -> int:
        """Replace what `pod` holds with `index` (from `export_pod`); returns the engine
        entries restored. Restored blocks count as accessed now; caps apply as for events."""
        state = self._state(pod)
        now = self._clock()
        self._evictor.tick(now)
        self._clear_state(state)
        return self._ingest.restore(state, index, now)

    # -- eviction -------------------------------------------------------------------------

    def evict(self, now: float | None = None) -> None:
        """The eviction pass: expire router-side entries, enforce every cap.

        Runs by itself every `eviction_interval_s` (checked on each call into the table)
        and whenever a store crosses its cap; the gateway also calls it on a timer so an
        idle index is trimmed too.
        """
        self._evictor.run(self._clock() if now is None else now)

    # -- internals ------------------------------------------------------------------------

    def _candidate_bits(self, names: tuple[str, ...]) -> Candidates:
        pods = self._pods
        bits = {name: pods[name].bit if name in pods else 0 for name in names}
        native = self._native
        found = Candidates(bits, native)
        if len(self._candidates) >= _CANDIDATE_LISTS:
            self._candidates.clear()
        self._candidates[names] = found
        return found

    def _state(self, pod: str) -> IndexedPod:
        state = self._pods.get(pod)
        if state is None:
            raise UnknownPodError(pod)
        return state

    def _clear_state(self, state: IndexedPod) -> None:
        self._holdings.drop_pod(state)
        self._epochs += 1
        state.epoch = self._epochs
