"""Steady client traffic through the gateway, recording the outcome of every request.

Open loop: requests start at `rate` per second (exponential gaps) whatever the gateway is
doing, bounded by `max_inflight` (a start that would exceed it is counted as skipped, not
sent). Chat requests share a few long system prompts, so engines store, hit and evict
blocks; a fraction are streamed. A request fails when it gets no complete answer: a
connection refused or cut, a non-200 status, a stream without its `[DONE]` (the record's
`error` is then `ChatAnswer.failure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from bench.harness.fleet import MODEL
from bench.harness.streaming import RequestRecord, post_chat
from bench.workloads.chat import WORDS


@dataclass(frozen=True, slots=True)
class TrafficShape:
    rate: float = 20.0
    max_inflight: int = 64
    stream_fraction: float = 0.5
    spread_fraction: float = 0.25
    """Share of requests sent with `x-kvgate-policy: round-robin`: prefix-cache routing
    alone never sends a new prompt to a pod that just restarted cold, and a fault armed on
    a pod needs traffic there to act."""
    system_prompts: int = 6
    system_words: int = 160
    user_words: int = 40
    max_tokens: int = 8
    timeout_s: float = 60.0


@dataclass
class LoadGenerator:
    gateway_url: str
    shape: TrafficShape
    rng: random.Random
    clock: Callable[[], float] = time.monotonic
    records: list[RequestRecord] = field(default_factory=list)
    skipped: int = 0
    _inflight: set[asyncio.Task[None]] = field(default_factory=set)
    _prompts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        words = self.shape.system_words
        self._prompts = [
            f"System prompt {i}. " + " ".join(self.rng.choice(WORDS) for _ in range(words))
            for i in range(self.shape.system_prompts)
        ]

    def headers(self) -> dict[str, str]:
        if self.rng.random() < self.shape.spread_fraction:
            return {"x-kvgate-policy": "round-robin"}
        return {}

    def body(self) -> dict[str, object]:
        user = " ".join(self.rng.choice(WORDS) for _ in range(self.shape.user_words))
        stream = self.rng.random() < self.shape.stream_fraction
        return {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": self.rng.choice(self._prompts)},
                {"role": "user", "content": f"{self.rng.randrange(10**9)} {user}"},
            ],
            "max_tokens": self.shape.max_tokens,
            "stream": stream,
        }

    async def run(self, stop: asyncio.Event) -> None:
        """Send until `stop` is set, then wait for the requests still in flight."""
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=128)
        timeout = httpx.Timeout(self.shape.timeout_s, connect=2.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            next_at = self.clock()
            while not stop.is_set():
                next_at += self.rng.expovariate(self.shape.rate)
                delay = next_at - self.clock()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        break
                if len(self._inflight) >= self.shape.max_inflight:
                    self.skipped += 1
                    continue
                task = asyncio.create_task(self._one(client, self.body(), self.headers()))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            if self._inflight:
                await asyncio.wait(set(self._inflight), timeout=self.shape.timeout_s + 5)

    async def _one(
        self, client: httpx.AsyncClient, body: dict[str, object], headers: dict[str, str]
    ) -> None:
        url = f"{self.gateway_url}/v1/chat/completions"
        answer = await post_chat(client, url, body, headers, clock=self.clock)
        stream = bool(body["stream"])
        self.records.append(RequestRecord.of(answer, error=answer.failure, stream=stream))

    def completed_since(self, since: float) -> int:
        return sum(1 for r in self.records if r.ended >= since and r.error is None)
