"""Continuous-batching scheduler: a bounded running batch, a FIFO waiting queue, engine steps.

Each step admits waiting requests (first come, first served, while the batch has room, the
step's token budget allows — one token per running request, then each prompt's uncached
tokens, as vLLM counts them — and the cache can reserve their blocks), then lasts the
model time of their prefill plus one decode step for the requests already running, scaled
to wall time. At the end of the step admitted requests emit their first token and store
their prompt blocks, running requests emit one token each (storing blocks they fill), and
the step's cache events are handed to `on_step_end` as one batch.

Chunked prefill, as vLLM's: a prompt whose uncached tokens exceed the whole budget of a
step is prefilled over several steps, a budget's worth at a time (after the decode
tokens of the running requests, which keep getting one token per step), and nothing else
is admitted while it runs; each chunk costs its tokens plus their attention over every
token before them, so the chunks together cost what the prompt costs in one piece. Its
full blocks are stored as each chunk completes, and its first token leaves at the end of
the step that completes its prefill.

Safety net (SGLang's): when nothing runs and the head request cannot be admitted because
pins hold the cache, every pin is dropped, a warning is logged and `auto_unpins` counts it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from simulator.cache import PagedPrefixCache
from simulator.cache_types import Allocation, Tier
from simulator.latency import LatencyModel

logger = logging.getLogger(__name__)

StepHook = Callable[[], Awaitable[None]]


@dataclass(eq=False)
class SimRequest:
    """One generation request; tokens arrive on `stream` as ints, then None (finished)."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    rng: random.Random
    vocabulary: tuple[int, ...]
    arrival: float = 0.0
    stream: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    generated: list[int] = field(default_factory=list)
    alloc: Allocation | None = None
    cached_tokens: int = 0
    prefilled: int = 0
    """Prompt tokens computed or found cached so far (a chunked prefill's progress)."""
    first_token_at: float | None = None
    finished: bool = False
    aborted: bool = False
    killed: bool = False
    """Ended by an engine restart: its client gets a cut stream or an error, not an answer."""

    def next_token(self) -> int:
        return self.rng.choice(self.vocabulary)


@dataclass
class SchedulerStats:
    auto_unpins: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0


class Scheduler:
    def __init__(
        self,
        cache: PagedPrefixCache,
        latency: LatencyModel,
        *,
        max_batch: int,
        max_batched_tokens: int,
        on_step_end: StepHook,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        extra_delay: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.cache = cache
        self.latency = latency
        self.max_batch = max_batch
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = SchedulerStats()
        self.on_first_token: Callable[[SimRequest], None] = lambda request: None
        self._on_step_end = on_step_end
        self._clock = clock
        self._sleep = sleep
        self._extra_delay = extra_delay
        self._wake = asyncio.Event()

    def submit(self, request: SimRequest) -> None:
        request.arrival = self._clock()
        self.waiting.append(request)
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        """Stop a request (client went away); its cache hold is released at the next step."""
        request.aborted = True
        self._wake.set()

    def kill_all(self) -> int:
        """End every request, as an engine restart does; returns how many there were."""
        killed = 0
        for request in [*self.waiting, *self.running]:
            if request.aborted or request.finished:
                continue
            request.killed = request.aborted = True
            killed += 1
            if request in self.waiting:  # never admitted: nothing to release, tell it now
                request.stream.put_nowait(None)
        self._wake.set()
        return killed

    def poke(self) -> None:
        """Run a step soon even when idle, so pending cache events get published."""
        self._wake.set()

    def prefill_cost(self, request: SimRequest, alloc: Allocation) -> float:
        size = self.cache.block_size
        cached = alloc.matched_blocks * size
        return self.latency.prefill_seconds(
            len(request.prompt) - cached,
            cached,
            host_tokens=alloc.hits[Tier.CPU] * size,
            disk_tokens=alloc.hits[Tier.STORAGE] * size,
        )

    async def run(self) -> None:
        """The engine loop; sleeps until woken whenever a step made no progress."""
        while True:
            if not await self.step():
                await self._wake.wait()

    async def step(self) -> bool:
        """One engine step; returns whether any request was admitted or produced a token."""
        self._wake.clear()
        self._drop_aborted()
        decoding = [r for r in self.running if r.prefilled == len(r.prompt)]
        chunked = next((r for r in self.running if r.prefilled < len(r.prompt)), None)
        budget = self.max_batched_tokens - len(decoding)
        model_time = self.latency.decode_step_seconds(len(decoding))
        if chunked is not None:  # a long prefill goes on, and takes the step's budget
            model_time += self._prefill_chunk(chunked, budget)
            admitted = [chunked]
        else:
            admitted = self._admit(budget)
            for index, request in enumerate(admitted):
                if request.alloc is None:
                    continue
                if index == 0 and self._uncached(request) > budget:
                    model_time += self._prefill_chunk(request, budget)
                else:
                    request.prefilled = len(request.prompt)
                    model_time += self.prefill_cost(request, request.alloc)
        delay = self.latency.to_wall(model_time) + self._extra_delay()
        await self._sleep(delay)
        self.stats.steps += 1
        for request in admitted:
            if request.killed:  # the engine restarted during its prefill: nothing was kept
                continue
            if request.alloc is not None:
                self.cache.commit(request.alloc, request.prompt[: request.prefilled])
            if request.prefilled == len(request.prompt):
                self._emit_token(request)
        for request in decoding:
            if not request.aborted:
                self._emit_token(request)
        await self._on_step_end()
        return bool(admitted or decoding)

    def _prefill_chunk(self, request: SimRequest, budget: int) -> float:
        """Prefill the next `budget` tokens of `request` (at least one); its model time:
        those tokens and their attention over all before them, plus the request's overhead
        and the load of its offloaded cached blocks with the first chunk."""
        start = request.prefilled
        first = start == 0
        if first:
            start = request.cached_tokens
        end = min(len(request.prompt), start + max(1, budget))
        request.prefilled = end
        if first and request.alloc is not None:
            size = self.cache.block_size
            return self.latency.prefill_seconds(
                end - start,
                start,
                host_tokens=request.alloc.hits[Tier.CPU] * size,
                disk_tokens=request.alloc.hits[Tier.STORAGE] * size,
            )
        return self.latency.prefill_seconds(end - start, start, overhead=False)

    def _admit(self, budget: int) -> list[SimRequest]:
        """Waiting requests admitted in this step, within `budget` tokens (what is left of
        vLLM's token budget after each running request's decode token): each admitted
        prompt counts the tokens it must compute (its uncached part: prefix-cache hits are
        free). The first may exceed it: it is then prefilled in chunks, alone."""
        admitted: list[SimRequest] = []
        while self.waiting and len(self.running) < self.max_batch:
            request = self.waiting[0]
            if request.aborted:
                self.waiting.popleft()
                continue
            prompt = len(request.prompt)
            if admitted and prompt > budget and self._uncached_tokens(request) > budget:
                break
            total = prompt + request.max_tokens
            alloc = self.cache.acquire(request.prompt, total)
            if alloc is None and not self.running and not admitted and self.cache.pinned_blocks:
                dropped = self.cache.unpin_all()
                self.stats.auto_unpins += 1
                logger.warning(
                    "auto-unpinned %d pins: request %s needs %d blocks and pins left no room",
                    dropped,
                    request.request_id,
                    self.cache.blocks_needed(total),
                )
                alloc = self.cache.acquire(request.prompt, total)
            if alloc is None:
                break
            self.waiting.popleft()
            request.alloc = alloc
            request.cached_tokens = alloc.matched_blocks * self.cache.block_size
            self.stats.prompt_tokens += prompt
            self.stats.cached_tokens += request.cached_tokens
            budget -= prompt - request.cached_tokens
            self.running.append(request)
            admitted.append(request)
        return admitted

    def _uncached(self, request: SimRequest) -> int:
        """The tokens an admitted request's prefill computes (its cached prefix is free)."""
        return len(request.prompt) - request.cached_tokens

    def _uncached_tokens(self, request: SimRequest) -> int:
        """The tokens `request`'s prefill would compute now: its prompt less the prefix
        the cache holds."""
        return len(request.prompt) - len(self.cache.match(request.prompt)) * self.cache.block_size

    def _emit_token(self, request: SimRequest) -> None:
        if request.finished or request.aborted:
            return
        token = request.next_token()
        request.generated.append(token)
        self.stats.generation_tokens += 1
        if request.first_token_at is None:
            request.first_token_at = self._clock()
            self.on_first_token(request)
        request.stream.put_nowait(token)
        computed = len(request.prompt) + len(request.generated) - 1
        if request.alloc is not None and computed // self.cache.block_size > len(
            request.alloc.blocks
        ):
            self.cache.commit(request.alloc, request.prompt + request.generated[:-1])
        if len(request.generated) >= request.max_tokens:
            self._finish(request)

    def _finish(self, request: SimRequest) -> None:
        request.finished = True
        if request.alloc is not None:
            self.cache.release(request.alloc)
        if request in self.running:
            self.running.remove(request)
        self.stats.finished += 1
        request.stream.put_nowait(None)

    def _drop_aborted(self) -> None:
        for request in [r for r in self.running if r.aborted]:
            if request.alloc is not None:
                self.cache.release(request.alloc)
            self.running.remove(request)
            self.stats.aborted += 1
            request.stream.put_nowait(None)
