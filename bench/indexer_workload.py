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
"""

from __future__ import annotations

import random
from array import array
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
    systems = [
        _tokens(rng, rng.randint(*system_blocks) * block_size) for _ in range(system_prompts)
    ]
    weights = [1.0 / (rank + 1) for rank in range(system_prompts)]
    chain_tokens = chain_blocks * block_size
    contexts: list[list[int]] = []  # chains built so far, for sharing
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
            chain = list(rng.choices(systems, weights)[0])
            if contexts and rng.random() < p_shared_context:
                donor = rng.choice(contexts)
                cut = rng.randint(len(chain), chain_tokens)
                chain += donor[len(chain) : cut]
            chain += _tokens(rng, chain_tokens - len(chain))
            chain = chain[:chain_tokens]
            contexts.append(chain)
            if len(sample_prompts) < prompts and rng.random() < 0.5:
                sample_prompts.append((name, chain))
            stored += _announce(chain, block_size, salt, held, pod_events, event_blocks)
            distinct.update(held)
        events[name] = pod_events
        total += stored
    return FleetWorkload(names, events, sample_prompts, total, len(distinct))


def _announce(
    chain: list[int],
    block_size: int,
    salt: int,
    held: dict[bytes, int],
    out: list[StoredEvent],
    event_blocks: int,
) -> int:
    """Append the events a pod publishes for `chain`: only the blocks it did not hold."""
    digest = xxhash.xxh64()
    keys: list[bytes] = []
    for start in range(0, len(chain), block_size):
        digest.update(bytes(str(chain[start : start + block_size]), "ascii"))
        keys.append(digest.digest())
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
