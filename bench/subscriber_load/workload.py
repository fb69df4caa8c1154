"""What each simulated engine serves: the simulator's paged prefix cache under a chat-like
load, where one step's cache changes are one vLLM event batch."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from simulator.block_hash import BlockHasher
from simulator.cache import PagedPrefixCache
from simulator.cache_types import Tier
from simulator.wire import AllBlocksCleared, EventCollector, EventEncoder, HashCodec

MODEL = "bench-model"
TOPIC = "kv-events"
BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class PublisherSpec:
    name: str
    seed: int
    gpu_blocks: int = 2048
    replay_buffer: int = 10_000
    requests_per_batch: int = 2


class Workload:
    """The simulator's paged cache under a chat-like load; one step's changes = one batch."""

    def __init__(self, spec: PublisherSpec) -> None:
        self._rng = random.Random(spec.seed)
        self._requests = spec.requests_per_batch
        self.codec = HashCodec("int", "vllm")
        self._events = EventCollector(self.codec, BLOCK_SIZE)
        self._encoder = EventEncoder("map", "vllm")
        self.cache = PagedPrefixCache(
            BlockHasher(BLOCK_SIZE), self._events, gpu_blocks=spec.gpu_blocks
        )
        self._vocab = range(32_000)
        self._systems = [self._tokens(self._rng.choice((64, 256, 512, 1024))) for _ in range(8)]
        self._conversations: deque[list[int]] = deque(maxlen=64)

    def step(self) -> tuple[bytes, int, int]:
        """Serve requests until the cache changed; returns (payload, events, block hashes)."""
        while True:
            for _ in range(self._requests):
                self._serve_one()
            batch = self._events.take_batch()
            if batch is not None:
                break
        blocks = sum(
            len(event.block_hashes)
            for event in batch.events
            if not isinstance(event, AllBlocksCleared)
        )
        return self._encoder.encode(batch), len(batch.events), blocks

    def resident(self) -> list[int]:
        return [int(self.codec.publish(block)) for block in self.cache.resident(Tier.GPU)]

    def _tokens(self, count: int) -> list[int]:
        return self._rng.choices(self._vocab, k=count)

    def _serve_one(self) -> None:
        rng = self._rng
        if self._conversations and rng.random() < 0.5:
            history = self._conversations[rng.randrange(len(self._conversations))]
            prompt = history + self._tokens(rng.randint(16, 256))
        else:
            prompt = rng.choice(self._systems) + self._tokens(rng.randint(32, 512))
        tokens = prompt + self._tokens(rng.randint(16, 128))
        alloc = self.cache.acquire(prompt, len(tokens))
        if alloc is None:
            return
        self.cache.commit(alloc, tokens)
        self.cache.release(alloc)
        if len(tokens) < 4096:
            self._conversations.append(tokens)
