"""A synthetic fleet's KV events, for the indexer benchmark.

Every pod holds `blocks_per_pod` blocks made of chains of `chain_blocks` blocks, built
the way chat traffic builds them:
- a system prompt (Zipf-popular, from a small set shared by the whole fleet),
- then, with probability `p_shared_context`, the first part of a context another chain
  already used (a document or conversation several pods have seen),
- then tokens unique to this chain.
Events look like vLLM's: a pod announces only blocks it does not hold yet, in BlockStored
events of at most `event_blocks` blocks chained by `parent_block_hash`, and engine hashes
are per-pod opaque 64-bit ints (vLLM seeds its hash randomly per process).
Deterministic for a given seed.

`build_churn` makes a stream of a full fleet instead: stores and the LRU evictions they
cause, interleaved, with what each pod holds bounded.
"""

from __future__ import annotations

import random
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import xxhash

VOCAB = 150_000
_TOKENS = list(range(VOCAB))  # shared int objects: the events then cost a pointer per token


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A BlockStored event as the indexer reads it (the field names are vLLM's)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: Sequence[int]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = "GPU"

    def as_decoded(self) -> StoredEvent:
        """This event with its token ids as a fresh list of ints, as a decoder returns them
        (the workload keeps them packed to stay small)."""
        return replace(self, token_ids=list(self.token_ids))


@dataclass(frozen=True, slots=True)
class FleetWorkload:
    pods: list[str]
    events: dict[str, list[StoredEvent]]
    """Per pod, in publication order."""
    prompts: list[tuple[str, list[int]]]
    """(a pod holding it, token ids) of chains in the fleet (for match queries)."""
    total_blocks: int
    distinct_blocks: int


def _tokens(rng: random.Random, count: int) -> list[int]:
    return [_TOKENS[rng.randrange(VOCAB)] for _ in range(count)]


@dataclass(frozen=True, slots=True)
class ChainShape:
    """How chains are built (see module docstring)."""

    block_size: int = 16
    chain_blocks: int = 128
    system_prompts: int = 16
    system_blocks: tuple[int, int] = (8, 40)
    p_shared_context: float = 0.3


class _Chains:
    """Token chains built the way chat traffic builds them (see module docstring)."""

    def __init__(self, rng: random.Random, shape: ChainShape) -> None:
        self._rng = rng
        self._systems = [
            _tokens(rng, rng.randint(*shape.system_blocks) * shape.block_size)
            for _ in range(shape.system_prompts)
        ]
        self._weights = [1.0 / (rank + 1) for rank in range(shape.system_prompts)]
        self._tokens = shape.chain_blocks * shape.block_size
        self._p_shared = shape.p_shared_context
        self._contexts: list[list[int]] = []  # chains built so far, for sharing

    def next(self) -> list[int]:
        rng = self._rng
        chain = list(rng.choices(self._systems, self._weights)[0])
        if self._contexts and rng.random() < self._p_shared:
            donor = rng.choice(self._contexts)
            cut = rng.randint(len(chain), self._tokens)
            chain += donor[len(chain) : cut]
        chain += _tokens(rng, self._tokens - len(chain))
        chain = chain[: self._tokens]
        self._contexts.append(chain)
        return chain


def build_fleet(
    *,
    pods: int,
    blocks_per_pod: int,
    block_size: int = 16,
    chain_blocks: int = 128,
    system_prompts: int = 16,
    system_blocks: tuple[int, int] = (8, 40),
    p_shared_context: float = 0.3,
    event_blocks: int = 32,
    prompts: int = 200,
    seed: int = 7,
) -> FleetWorkload:
    rng = random.Random(seed)
    shape = ChainShape(block_size, chain_blocks, system_prompts, system_blocks, p_shared_context)
    chains = _Chains(rng, shape)
    names = [f"pod-{i:03d}" for i in range(pods)]
    events: dict[str, list[StoredEvent]] = {}
    sample_prompts: list[tuple[str, list[int]]] = []
    distinct: set[bytes] = set()
    total = 0
    for name in names:
        salt = rng.getrandbits(64)
        held: dict[bytes, int] = {}  # content key (whole prefix digest) -> engine hash
        pod_events: list[StoredEvent] = []
        stored = 0
        while stored < blocks_per_pod:
            chain = chains.next()
            if len(sample_prompts) < prompts and rng.random() < 0.5:
                sample_prompts.append((name, chain))
            stored += _announce(chain, block_size, salt, held, pod_events, event_blocks)
            distinct.update(held)
        events[name] = pod_events
        total += stored
    return FleetWorkload(names, events, sample_prompts, total, len(distinct))


@dataclass(frozen=True, slots=True)
class RemovedEvent:
    """A BlockRemoved event: engine hashes, the tail of a chain first."""

    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ChurnWorkload:
    pods: list[str]
    stream: list[tuple[str, StoredEvent | RemovedEvent]]
    """(pod, event) in publication order, the pods' events interleaved."""
    prompts: list[tuple[str, list[int]]]
    """Chains of the stream's last stretch (for match queries on the final state)."""
    stored_blocks: int
    removed_blocks: int
    held_blocks: int
    """(block, pod) pairs held once the whole stream is applied."""


def build_churn(
    *,
    pods: int,
    held_blocks: int,
    turnover: float = 3.0,
    shape: ChainShape = ChainShape(),
    event_blocks: int = 32,
    prompts: int = 200,
    seed: int = 11,
) -> ChurnWorkload:
    """A fleet whose pods are full: each holds at most `held_blocks / pods` blocks and
    evicts its least recently used ones as new chains arrive, until `turnover` × the held
    blocks have been stored. As vLLM frees a request's blocks tail first, a chain's blocks
    are used from its tail to its root, so a block is always evicted before its parent and
    what a pod holds stays prefix-closed; evictions are published as BlockRemoved events
    of at most `event_blocks` hashes, right after the BlockStored that caused them."""
    rng = random.Random(seed)
    chains = _Chains(rng, shape)
    block_size = shape.block_size
    names = [f"pod-{i:03d}" for i in range(pods)]
    capacity = max(shape.chain_blocks, held_blocks // pods)
    salts = {name: rng.getrandbits(64) for name in names}
    recency: dict[str, OrderedDict[bytes, int]] = {name: OrderedDict() for name in names}
    stream: list[tuple[str, StoredEvent | RemovedEvent]] = []
    recent: list[tuple[str, list[int]]] = []
    stored = removed = 0
    while stored < turnover * held_blocks:
        name = names[rng.randrange(pods)]
        chain = chains.next()
        recent.append((name, chain))
        held = recency[name]
        out: list[StoredEvent] = []
        keys = _block_keys(chain, block_size)
        stored += _announce(chain, block_size, salts[name], held, out, event_blocks, keys)
        stream.extend((name, event) for event in out)
        for key in reversed(keys):  # tail first: the root is the most recently used
            held.move_to_end(key)
        evicted: list[int] = []
        while len(held) > capacity:
            evicted.append(held.popitem(last=False)[1])
        removed += len(evicted)
        for start in range(0, len(evicted), event_blocks):
            stream.append((name, RemovedEvent(tuple(evicted[start : start + event_blocks]))))
    held_now = sum(len(held) for held in recency.values())
    tail = recent[-prompts:]
    return ChurnWorkload(names, stream, tail, stored, removed, held_now)


def _block_keys(chain: list[int], block_size: int) -> list[bytes]:
    """Each block's content key: the digest of the whole prefix it ends."""
    digest = xxhash.xxh64()
    keys: list[bytes] = []
    for start in range(0, len(chain), block_size):
        digest.update(bytes(str(chain[start : start + block_size]), "ascii"))
        keys.append(digest.digest())
    return keys


def _announce(
    chain: list[int],
    block_size: int,
    salt: int,
    held: dict[bytes, int],
    out: list[StoredEvent],
    event_blocks: int,
    keys: list[bytes] | None = None,
) -> int:
    """Append the events a pod publishes for `chain`: only the blocks it did not hold
    (what it holds of a chain is a prefix of it)."""
    if keys is None:
        keys = _block_keys(chain, block_size)
    first_new = 0
    while first_new < len(keys) and keys[first_new] in held:
        first_new += 1
    parent = held[keys[first_new - 1]] if first_new else None
    for key in keys[first_new:]:
        held[key] = xxhash.xxh64_intdigest(key, salt)
    for start in range(first_new, len(keys), event_blocks):
        stop = min(start + event_blocks, len(keys))
        hashes = tuple(held[key] for key in keys[start:stop])
        out.append(
            StoredEvent(
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=array("I", chain[start * block_size : stop * block_size]),
                block_size=block_size,
            )
        )
        parent = hashes[-1]
    return len(keys) - first_new
