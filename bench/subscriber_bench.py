"""`kvgate bench subscriber`: KV events/s one gateway process ingests, and gap recovery time.

The gateway side (a `SubscriberManager` feeding an `IndexSink` over a `SyncPrefixHashTable`,
as `kvgate serve` runs it) lives in this process. Each simulated engine is a separate
process (multiprocessing, spawn) that drives the simulator's own paged prefix cache, event
collector, vLLM wire encoder and `EventPublisher` (PUB + replay ROUTER on loopback ports it
binds itself): every step serves a few requests (shared system prompts, continued
conversations, unique tails), and the cache changes of that step — BlockStored chains with
their parents, BlockRemoved evictions once the cache is full — are one vLLM batch.

Phases (the subscriber stays live throughout):
1. live (`--seconds`): every engine steps its cache and publishes each batch at once, as
   fast as it can; on a small machine the engines, not the subscriber, set the pace;
2. burst (`--batches`): every engine prepares N batches (untimed, nothing sent), then sends
   them back to back: the subscriber drains a backlog at its own pace, which is the ingest
   rate reported: batches, events and block hashes applied to the index from the first
   send until the last batch is applied (the live rates leave out the first 20 % and the
   last 10 % of that window). A probe task records how long the event loop went without
   running it (stalls).
   After each of these phases, every pod's `table.dump` is compared with the hashes its
   engine's cache holds;
3. gaps: one engine drops K batches from its PUB socket (they stay in its replay buffer, as
   the sim's `drop_batches` fault does) and publishes one more; recovery is the time from
   that batch's send to the moment the pod's index holds everything the engine announced;
4. overrun: an engine whose replay buffer is smaller than the gap; recovery is the time
   until the pod is live again; the index must hold nothing the engine does not. Then the
   engine publishes for another second: how much of its cache does the index learn again?

Figures (JSON keys): ingest_events_per_s, ingest_batches_per_s, ingest_blocks_per_s,
ingest_events_per_cpu_s, subscriber_cpu_s, ingest_event_loop_max_stall_ms, live_*,
index_equals_engines, gap_recovery_p50_ms, gap_recovery_max_ms, overrun_recovery_ms,
overrun_missing_after_churn (and the counters behind them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import os
import random
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import zmq.asyncio

from bench.results_io import (
    add_output_arguments,
    percentile,
    print_table,
    pyplot,
    write_json,
)
from gateway.runtime import tune_gc
from indexer import IndexConfig, SyncPrefixHashTable
from simulator.block_hash import BlockHasher
from simulator.cache import PagedPrefixCache
from simulator.cache_types import Tier
from simulator.publisher import EventPublisher
from simulator.wire import AllBlocksCleared, EventCollector, EventEncoder, HashCodec
from subscriber import IndexSink, KVEventBatch, Phase, PodEndpoint, SubscriberManager
from subscriber.events import AllBlocksCleared as DecodedCleared

MODEL = "bench-model"
TOPIC = "kv-events"
BLOCK_SIZE = 16
PROBE_INTERVAL_S = 0.005
OVERRUN_CHURN_S = 1.0
CATCH_UP_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------------------
# The simulated engines (child processes)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublisherSpec:
    name: str
    seed: int
    gpu_blocks: int = 2048
    replay_buffer: int = 10_000
    requests_per_batch: int = 2


class _Workload:
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


@dataclass(slots=True)
class _Sent:
    """What an engine published: batches, events and block hashes (stored + removed)."""

    batches: int = 0
    events: int = 0
    blocks: int = 0

    def add(self, events: int, blocks: int) -> None:
        self.batches += 1
        self.events += events
        self.blocks += blocks

    def copy(self) -> _Sent:
        return _Sent(self.batches, self.events, self.blocks)

    def since(self, before: _Sent) -> dict[str, int]:
        return {
            "batches": self.batches - before.batches,
            "events": self.events - before.events,
            "blocks": self.blocks - before.blocks,
        }


class _Engine:
    """One child's command handler.

    - `live S`: step the cache and publish each batch at once, as fast as possible, S seconds;
    - `prepare N`: step the cache N times, keeping the encoded batches (nothing is sent);
    - `burst`: send every prepared batch back to back;
    - `gap K`: K batches dropped from PUB (still in the replay buffer), then one sent;
    - `resident`: the last seq and the hashes the cache holds.
    """

    def __init__(self, workload: _Workload, publisher: EventPublisher) -> None:
        self._workload = workload
        self._publisher = publisher
        self._sent = _Sent()
        self._pool: list[tuple[bytes, int, int]] = []

    async def handle(self, command: tuple[Any, ...]) -> dict[str, Any]:
        name, *params = command
        if name == "live":
            return await self._live(float(params[0]))
        if name == "prepare":
            return self._prepare(int(params[0]))
        if name == "burst":
            return await self._burst()
        if name == "gap":
            return await self._gap(int(params[0]))
        if name == "resident":
            return {"last_seq": self._publisher.next_seq - 1, "resident": self._workload.resident()}
        raise ValueError(f"unknown command {command!r}")

    async def _send(self, payload: bytes, events: int, blocks: int, *, drop: bool = False) -> int:
        seq = await self._publisher.publish(payload, drop=drop)
        self._sent.add(events, blocks)
        return seq

    async def _live(self, seconds: float) -> dict[str, Any]:
        before = self._sent.copy()
        started = time.monotonic()
        deadline = started + seconds
        while time.monotonic() < deadline:
            await self._send(*self._workload.step())
            await asyncio.sleep(0)  # the replay ROUTER answers meanwhile
        return self._report(before, started)

    def _prepare(self, batches: int) -> dict[str, Any]:
        started = time.process_time()
        self._pool = [self._workload.step() for _ in range(batches)]
        return {"batches": batches, "cpu_s": time.process_time() - started}

    async def _burst(self) -> dict[str, Any]:
        before = self._sent.copy()
        pool, self._pool = self._pool, []
        started = time.monotonic()
        for index, batch in enumerate(pool):
            await self._send(*batch)
            if index % 64 == 63:
                await asyncio.sleep(0)
        return self._report(before, started)

    async def _gap(self, drops: int) -> dict[str, Any]:
        for _ in range(drops):
            await self._send(*self._workload.step(), drop=True)
        batch = self._workload.step()
        sent_at = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every process
        seq = await self._send(*batch)
        return {"seq": seq, "sent_at": sent_at}

    def _report(self, before: _Sent, started: float) -> dict[str, Any]:
        return {
            **self._sent.since(before),
            "started_at": started,
            "ended_at": time.monotonic(),
            "last_seq": self._publisher.next_seq - 1,
        }


def _publisher_main(spec: PublisherSpec, conn: Connection) -> None:
    """Entry point of an engine process."""
    asyncio.run(_publisher_loop(spec, conn))


async def _publisher_loop(spec: PublisherSpec, conn: Connection) -> None:
    context = zmq.asyncio.Context()
    publisher = EventPublisher(
        context,
        events_endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        topic=TOPIC,
        buffer_size=spec.replay_buffer,
    )
    await publisher.start()
    try:
        conn.send({"events": publisher.events_endpoint, "replay": publisher.replay_endpoint})
        engine = _Engine(_Workload(spec), publisher)
        while True:
            command = await _receive(conn)
            if command[0] == "stop":
                break
            conn.send(await engine.handle(command))
    finally:
        await publisher.stop()
        context.destroy(linger=0)
        conn.close()


async def _receive(conn: Connection, timeout_s: float | None = None) -> Any:
    """`conn.recv()` without blocking the event loop (replays and subscribers keep running)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not conn.poll():
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no answer from an engine process within {timeout_s} s")
        await asyncio.sleep(0.002)
    return conn.recv()


@dataclass
class _EngineProcess:
    name: str
    process: BaseProcess
    conn: Connection
    endpoint: PodEndpoint

    async def ask(
        self, *command: Any, timeout_s: float | None = CATCH_UP_TIMEOUT_S
    ) -> dict[str, Any]:
        """Send a command; its answer (EOFError if the engine process died)."""
        self.conn.send(command)
        answer: dict[str, Any] = await _receive(self.conn, timeout_s)
        return answer

    def stop(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(("stop",))
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        self.conn.close()


async def _spawn(specs: list[PublisherSpec]) -> list[_EngineProcess]:
    context = multiprocessing.get_context("spawn")
    started: list[tuple[PublisherSpec, BaseProcess, Connection]] = []
    for spec in specs:
        parent, child = context.Pipe()
        process = context.Process(
            target=_publisher_main, args=(spec, child), name=f"kv-pub-{spec.name}", daemon=True
        )
        process.start()
        child.close()
        started.append((spec, process, parent))
    engines = []
    try:
        for spec, child_process, conn in started:
            hello = await _receive(conn, timeout_s=60)
            endpoint = PodEndpoint(
                spec.name, MODEL, events=hello["events"], replay=hello["replay"], topic=TOPIC
            )
            engines.append(_EngineProcess(spec.name, child_process, conn, endpoint))
    except BaseException:
        for _, child_process, conn in started:
            child_process.terminate()
            child_process.join(timeout=5)
            conn.close()
        raise
    return engines


# --------------------------------------------------------------------------------------
# The gateway side (this process)
# --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _PodCounts:
    batches: int = 0
    events: int = 0
    blocks: int = 0
    last_applied_at: float = 0.0


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    """Seconds since the benchmark started."""
    events_by_pod: dict[str, int]
    totals: tuple[int, int, int]
    """Batches, events and block hashes applied so far, all pods."""


class CountingSink:
    """An `IndexSink` that also counts what it applied per pod, and when.

    It samples its counters itself, every `sample_every` batches: while a backlog is
    drained the subscriber does not yield to the event loop, so a sampling task would not
    run then.
    """

    def __init__(self, inner: IndexSink, t0: float, sample_every: int = 16) -> None:
        self.inner = inner
        self.table = inner.table
        self.t0 = t0
        self.counts: dict[str, _PodCounts] = {}
        self.samples: list[_Sample] = []
        self._sample_every = sample_every
        self._totals = [0, 0, 0]

    def register(self, pod: str, model: str, lora_names: Mapping[int, str]) -> None:
        self.inner.register(pod, model, lora_names)
        self.counts.setdefault(pod, _PodCounts())

    def apply(self, pod: str, batch: KVEventBatch) -> None:
        self.inner.apply(pod, batch)
        events = len(batch.events)
        blocks = sum(
            len(event.block_hashes)
            for event in batch.events
            if not isinstance(event, DecodedCleared)
        )
        counts = self.counts[pod]
        counts.batches += 1
        counts.events += events
        counts.blocks += blocks
        counts.last_applied_at = time.monotonic()
        totals = self._totals
        totals[0] += 1
        totals[1] += events
        totals[2] += blocks
        if totals[0] % self._sample_every == 0:
            self.sample(counts.last_applied_at)

    def sample(self, now: float | None = None) -> None:
        at = (time.monotonic() if now is None else now) - self.t0
        by_pod = {name: counts.events for name, counts in self.counts.items()}
        self.samples.append(_Sample(at, by_pod, self.totals()))

    def reset(self, pod: str) -> None:
        self.inner.reset(pod)

    def unregister(self, pod: str) -> None:
        self.inner.unregister(pod)

    def totals(self) -> tuple[int, int, int]:
        batches, events, blocks = self._totals
        return batches, events, blocks


@dataclass
class _Gateway:
    manager: SubscriberManager
    sink: CountingSink
    t0: float
    lags: list[tuple[float, float]] = field(default_factory=list)
    """(monotonic time, ms late) of every wake-up of the loop probe."""
    marks: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since start, recovery ms) of each gap injected."""
    phases: list[tuple[float, str]] = field(default_factory=list)

    @property
    def table(self) -> SyncPrefixHashTable:
        return self.sink.table

    async def probe_loop(self) -> None:
        """How late a task asking to wake every few ms is woken (event-loop stalls)."""
        while True:
            asked = time.monotonic()
            await asyncio.sleep(PROBE_INTERVAL_S)
            now = time.monotonic()
            self.lags.append((now, (now - asked - PROBE_INTERVAL_S) * 1e3))
            if len(self.lags) % 20 == 0:
                self.sink.sample(now)

    def max_lag_ms(self, start: float, end: float) -> float:
        """The longest stall of the event loop that ended within [start, end]."""
        return max((lag for at, lag in self.lags if start <= at <= end), default=0.0)

    async def wait_seq(self, pod: str, seq: int, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """Until the pod's subscriber has applied `seq` and is live again."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.manager.status(pod)
            if status is not None and status.last_seq == seq and status.phase is Phase.LIVE:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pod} did not reach seq {seq}: {status}")
            await asyncio.sleep(0.0005)

    async def wait_live(self, pod: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            status = self.manager.status(pod)
            if status is not None and status.phase is Phase.LIVE and status.connected:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the subscriber of {pod} is not live: {status}")
            await asyncio.sleep(0.01)

    def mark(self, label: str) -> None:
        self.phases.append((time.monotonic() - self.t0, label))
        self.sink.sample()

    def diff(self, pod: str, resident: list[int]) -> tuple[int, int]:
        """(stale, missing): blocks the index holds that the engine does not, and back."""
        held = self.table.dump(pod)
        engine = set(resident)
        return len(held - engine), len(engine - held)


# --------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------


async def _publishing(
    gateway: _Gateway,
    engines: list[_EngineProcess],
    command: tuple[Any, ...],
    prefix: str,
    *,
    steady: bool,
    timeout_s: float = CATCH_UP_TIMEOUT_S,
) -> dict[str, Any]:
    """Run `command` on every engine at once; measure what the subscriber applied meanwhile.

    The window runs from the first send until the subscriber has applied every batch.
    Rates are over the whole window, or with `steady` over its middle only (the first 20 %
    and the last 10 % left out).
    """
    cpu_before = time.process_time()
    applied_before = gateway.sink.totals()
    reports = await asyncio.gather(*(e.ask(*command, timeout_s=timeout_s) for e in engines))
    await asyncio.gather(
        *(gateway.wait_seq(e.name, r["last_seq"]) for e, r in zip(engines, reports, strict=True))
    )
    cpu_s = time.process_time() - cpu_before
    start = min(r["started_at"] for r in reports)
    published_end = max(r["ended_at"] for r in reports)
    caught_up = max(gateway.sink.counts[e.name].last_applied_at for e in engines)
    span = caught_up - start
    applied = [
        now - before for now, before in zip(gateway.sink.totals(), applied_before, strict=True)
    ]
    if steady:
        rates = _rates(gateway, start + 0.2 * span, caught_up - 0.1 * span)
    else:
        rates = dict(zip(("batches", "events", "blocks"), (n / span for n in applied), strict=True))
    published = {k: sum(r[k] for r in reports) for k in ("batches", "events", "blocks")}
    return {
        **{f"{prefix}_{name}_per_s": value for name, value in rates.items()},
        f"{prefix}_events_per_cpu_s": applied[1] / cpu_s,
        f"{prefix}_cpu_s": cpu_s,
        f"{prefix}_wall_s": span,
        f"{prefix}_publish_s": published_end - start,
        f"{prefix}_first_percent_applied_s": _first_percent_at(
            gateway, start, applied_before[0], applied[0]
        ),
        f"{prefix}_published": published,
        f"{prefix}_event_loop_max_stall_ms": gateway.max_lag_ms(start, caught_up + 0.05),
        f"{prefix}_pod_caught_up_s": {
            e.name: gateway.sink.counts[e.name].last_applied_at - start for e in engines
        },
        f"{prefix}_applied": dict(zip(("batches", "events", "blocks"), applied, strict=True)),
    }


def _first_percent_at(gateway: _Gateway, start: float, before: int, batches: int) -> float:
    """Seconds from `start` until 1 % of the phase's batches had been applied."""
    for sample in gateway.sink.samples:
        at = sample.at + gateway.t0
        if at >= start and sample.totals[0] - before >= batches / 100:
            return at - start
    return float("nan")


def _rates(gateway: _Gateway, start: float, end: float) -> dict[str, float]:
    """Batches, events and blocks applied per second over [start, end] (monotonic times)."""
    window = [s for s in gateway.sink.samples if start <= s.at + gateway.t0 <= end]
    if len(window) < 2:
        raise RuntimeError("the measured window holds < 2 samples: publish longer or more")
    first, last = window[0], window[-1]
    span = last.at - first.at
    return {
        name: (last.totals[i] - first.totals[i]) / span
        for i, name in enumerate(("batches", "events", "blocks"))
    }


async def _check_equal(gateway: _Gateway, engines: list[_EngineProcess]) -> dict[str, Any]:
    """Ask every engine what it holds (after the subscriber caught up) and diff the index."""
    stale = missing = resident = 0
    for engine in engines:
        state = await engine.ask("resident")
        await gateway.wait_seq(engine.name, state["last_seq"])
        pod_stale, pod_missing = gateway.diff(engine.name, state["resident"])
        stale += pod_stale
        missing += pod_missing
        resident += len(state["resident"])
    return {
        "equal": stale == missing == 0,
        "stale": stale,
        "missing": missing,
        "resident": resident,
    }


async def _gaps(
    gateway: _Gateway, engines: list[_EngineProcess], rounds: int, drops: int
) -> dict[str, Any]:
    """Drop `drops` batches from PUB, publish one more, time until the index caught up."""
    recoveries: list[float] = []
    consistent = True
    for index in range(rounds):
        engine = engines[index % len(engines)]
        before = gateway.manager.status(engine.name)
        answer = await engine.ask("gap", drops)
        await gateway.wait_seq(engine.name, answer["seq"])
        recovered_at = gateway.sink.counts[engine.name].last_applied_at
        recoveries.append((recovered_at - answer["sent_at"]) * 1e3)
        gateway.marks.append((answer["sent_at"] - gateway.t0, recoveries[-1]))
        after = gateway.manager.status(engine.name)
        state = await engine.ask("resident")
        stale, missing = gateway.diff(engine.name, state["resident"])
        replayed = (
            before is not None
            and after is not None
            and after.replays > before.replays
            and after.gaps > before.gaps
        )
        consistent = consistent and replayed and stale == missing == 0
        await asyncio.sleep(0.05)
    return {
        "gap_recovery_ms": recoveries,
        "gap_recovery_p50_ms": percentile(recoveries, 50),
        "gap_recovery_max_ms": max(recoveries),
        "gap_rounds_consistent": consistent,
    }


async def _overrun(gateway: _Gateway, engine: _EngineProcess, drops: int) -> dict[str, Any]:
    """A gap longer than the engine's replay buffer: reset, rebuild from what it has.

    Then the engine keeps serving for a while: how much of what it holds does the index
    learn again from new events alone?
    """
    await gateway.manager.upsert(engine.endpoint)
    try:
        await gateway.wait_live(engine.name)
        for _ in range(20):  # some history, which a reset must not leave behind
            answer = await engine.ask("gap", 0)
            await gateway.wait_seq(engine.name, answer["seq"])
        answer = await engine.ask("gap", drops)
        await gateway.wait_seq(engine.name, answer["seq"])
        recovered_at = gateway.sink.counts[engine.name].last_applied_at
        status = gateway.manager.status(engine.name)
        state = await engine.ask("resident")
        stale, missing = gateway.diff(engine.name, state["resident"])
        results = {
            "overrun_recovery_ms": (recovered_at - answer["sent_at"]) * 1e3,
            "overrun_stale_blocks": stale,
            "overrun_missing_blocks": missing,
            "overrun_engine_blocks": len(state["resident"]),
            "overrun_degraded_reason": status.degraded_reason if status else None,
            "overrun_whole": status.whole if status else None,
        }
        return {**results, **await _after_overrun(gateway, engine)}
    finally:
        await gateway.manager.remove(engine.name)


async def _after_overrun(gateway: _Gateway, engine: _EngineProcess) -> dict[str, Any]:
    broken_before = gateway.table.stats().rejected_blocks.get("broken_chain", 0)
    report = await engine.ask("live", OVERRUN_CHURN_S)
    await gateway.wait_seq(engine.name, report["last_seq"])
    state = await engine.ask("resident")
    stale, missing = gateway.diff(engine.name, state["resident"])
    broken = gateway.table.stats().rejected_blocks.get("broken_chain", 0) - broken_before
    return {
        "overrun_churn_batches": report["batches"],
        "overrun_churn_blocks_published": report["blocks"],
        "overrun_churn_broken_chain_blocks": broken,
        "overrun_stale_after_churn": stale,
        "overrun_missing_after_churn": missing,
        "overrun_engine_blocks_after_churn": len(state["resident"]),
    }


def _subscriber_counters(gateway: _Gateway, pods: list[str]) -> dict[str, int]:
    statuses = [gateway.manager.status(pod) for pod in pods]
    present = [s for s in statuses if s is not None]
    return {
        name: sum(getattr(s, name) for s in present)
        for name in ("batches_applied", "replays", "gaps", "restarts", "live_dropped")
    }


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchConfig:
    engines: int
    seconds: float
    batches: int
    gap_rounds: int
    gap_batches: int
    overrun_buffer: int
    gpu_blocks: int
    requests_per_batch: int
    seed: int
    quick: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchConfig:
        config = cls(
            engines=args.engines,
            seconds=args.seconds or (2.0 if args.quick else 8.0),
            batches=args.batches or (1000 if args.quick else 3000),
            gap_rounds=args.gap_rounds or (5 if args.quick else 10),
            gap_batches=args.gap_batches,
            overrun_buffer=args.overrun_buffer,
            gpu_blocks=args.gpu_blocks,
            requests_per_batch=args.requests_per_batch,
            seed=args.seed,
            quick=bool(args.quick),
        )
        for name in ("engines", "batches", "gap_rounds", "gap_batches", "overrun_buffer"):
            value = getattr(config, name)
            if value < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        return config

    def publisher_specs(self) -> list[PublisherSpec]:
        """The fleet's engines, then the overrun engine (a replay buffer shorter than a gap)."""
        specs = [
            PublisherSpec(
                f"engine-{i}", self.seed + i, self.gpu_blocks, 10_000, self.requests_per_batch
            )
            for i in range(self.engines)
        ]
        overrun = PublisherSpec(
            "engine-overrun",
            self.seed + self.engines,
            self.gpu_blocks,
            self.overrun_buffer,
            self.requests_per_batch,
        )
        return [*specs, overrun]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a short run (< 30 s)")
    parser.add_argument("--engines", type=int, default=4, help="publisher processes (default 4)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="live phase: seconds of stepping the cache and publishing (default 8; quick 2)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help="burst phase: batches per engine, prepared then sent back to back "
        "(default 3000; quick 1000)",
    )
    parser.add_argument(
        "--gap-rounds", type=int, default=None, help="gap recoveries timed (default 10; quick 5)"
    )
    parser.add_argument("--gap-batches", type=int, default=20, help="batches dropped per gap")
    parser.add_argument(
        "--overrun-buffer", type=int, default=8, help="replay buffer of the overrun engine"
    )
    parser.add_argument(
        "--gpu-blocks", type=int, default=2048, help="KV blocks per engine (the sim's default)"
    )
    parser.add_argument(
        "--requests-per-batch", type=int, default=2, help="requests served per engine step"
    )
    parser.add_argument("--seed", type=int, default=7, help="workload seed")
    add_output_arguments(parser, "subscriber")


def run(args: argparse.Namespace) -> int:
    config = BenchConfig.from_args(args)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"{config.engines} publisher processes and this subscriber process share {cores} cores "
        f"(live {config.seconds:g} s, then a burst of {config.batches} batches per engine)..."
    )
    previous_gc = tune_gc()  # as `kvgate serve` runs
    try:
        results, gateway = asyncio.run(_bench(config))
    finally:
        gc.set_threshold(*previous_gc)
    results["config"]["cores"] = cores
    _report(results)
    write_json(args.json, results)
    print(f"JSON written to {args.json}")
    if _plot(args.plot, gateway, results):
        print(f"plot written to {args.plot}")
    if not results["index_equals_engines"]:
        print("FAILED: the index differs from what the engines hold", file=sys.stderr)
        return 1
    return 0


async def _bench(config: BenchConfig) -> tuple[dict[str, Any], _Gateway]:
    processes = await _spawn(config.publisher_specs())
    try:
        *fleet, overrun_engine = processes
        t0 = time.monotonic()
        table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK_SIZE))
        sink = CountingSink(IndexSink(table), t0)
        async with SubscriberManager(sink) as manager:
            gateway = _Gateway(manager, sink, t0)
            probe = asyncio.create_task(gateway.probe_loop(), name="bench-loop-probe")
            try:
                results = await _phases(gateway, fleet, overrun_engine, config)
            finally:
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probe
    finally:
        for process in processes:
            process.stop()
    return results, gateway


async def _phases(
    gateway: _Gateway,
    fleet: list[_EngineProcess],
    overrun_engine: _EngineProcess,
    config: BenchConfig,
) -> dict[str, Any]:
    for engine in fleet:
        await gateway.manager.upsert(engine.endpoint)
    for engine in fleet:
        await gateway.wait_live(engine.name)
    pods = [engine.name for engine in fleet]
    gateway.mark("live")
    live_command = ("live", config.seconds)
    live_timeout = CATCH_UP_TIMEOUT_S + config.seconds
    live = await _publishing(
        gateway, fleet, live_command, "live", steady=True, timeout_s=live_timeout
    )
    checks = {"after_live": await _check_equal(gateway, fleet)}
    gateway.mark("prepare")
    prepare = await asyncio.gather(
        *(e.ask("prepare", config.batches, timeout_s=None) for e in fleet)
    )
    gateway.mark("burst")
    burst = await _publishing(gateway, fleet, ("burst",), "ingest", steady=False)
    burst["ingest_subscriber_counters"] = _subscriber_counters(gateway, pods)
    checks["after_burst"] = await _check_equal(gateway, fleet)
    gateway.mark("gaps")
    gaps = await _gaps(gateway, fleet, config.gap_rounds, config.gap_batches)
    checks["after_gaps"] = await _check_equal(gateway, fleet)
    gateway.mark("overrun")
    overrun = await _overrun(gateway, overrun_engine, config.overrun_buffer * 4)
    stats = gateway.table.stats()
    return {
        "config": {
            **{k: v for k, v in asdict(config).items() if k != "quick"},
            "block_size": BLOCK_SIZE,
            "overrun_gap_batches": config.overrun_buffer * 4,
            "quick": config.quick,
            "prepare_cpu_s_per_engine": max(p["cpu_s"] for p in prepare),
        },
        "engines": config.engines,
        **burst,
        "subscriber_cpu_s": burst["ingest_cpu_s"],
        **live,
        "index_equals_engines": all(check["equal"] for check in checks.values()),
        "index_checks": checks,
        **gaps,
        **overrun,
        "subscriber_counters": _subscriber_counters(gateway, pods),
        "index_rejected_blocks": dict(stats.rejected_blocks),
        "index_unknown_removals": stats.unknown_removals,
    }


def _report(results: dict[str, Any]) -> None:
    config = results["config"]
    counters = results["ingest_subscriber_counters"]
    r = results
    ingest_share = r["ingest_cpu_s"] / r["ingest_wall_s"]
    live_share = r["live_cpu_s"] / r["live_wall_s"]
    caught_up = list(r["ingest_pod_caught_up_s"].values())
    overrun = f"gap {config['overrun_gap_batches']} > buffer {config['overrun_buffer']}"
    rows = [
        ("burst: prepared batches sent back to back", "", ""),
        (
            "ingest_events_per_s",
            f"{r['ingest_events_per_s']:,.0f} events/s",
            "first send → caught up",
        ),
        ("ingest_batches_per_s", f"{r['ingest_batches_per_s']:,.0f} batches/s", ""),
        ("ingest_blocks_per_s", f"{r['ingest_blocks_per_s']:,.0f} blocks/s", "hashes in events"),
        ("ingest_events_per_cpu_s", f"{r['ingest_events_per_cpu_s']:,.0f} events/s", "per CPU s"),
        (
            "subscriber_cpu_s",
            f"{r['subscriber_cpu_s']:.2f} s",
            f"{ingest_share:.0%} of a core over {r['ingest_wall_s']:.1f} s",
        ),
        ("ingest_event_loop_max_stall_ms", f"{r['ingest_event_loop_max_stall_ms']:.0f} ms", ""),
        (
            "1 % of batches applied after",
            f"{r['ingest_first_percent_applied_s']:.2f} s",
            f"sending took {r['ingest_publish_s']:.2f} s",
        ),
        (
            "pods caught up after (first / last)",
            f"{min(caught_up):.2f} / {max(caught_up):.2f} s",
            "same backlog each",
        ),
        (
            "replays / gaps / live_dropped",
            f"{counters['replays']} / {counters['gaps']} / {counters['live_dropped']}",
            "subscriber counters",
        ),
        ("live: engines step the sim cache and publish", "", ""),
        ("live_events_per_s", f"{r['live_events_per_s']:,.0f} events/s", "steady window"),
        (
            "live_cpu_s",
            f"{r['live_cpu_s']:.2f} s",
            f"{live_share:.0%} of a core over {r['live_wall_s']:.1f} s",
        ),
        ("live_event_loop_max_stall_ms", f"{r['live_event_loop_max_stall_ms']:.0f} ms", ""),
        ("correctness and recovery", "", ""),
        ("index_equals_engines", str(r["index_equals_engines"]), "table.dump == resident set"),
        (
            "gap_recovery_p50_ms",
            f"{r['gap_recovery_p50_ms']:.1f} ms",
            f"{config['gap_batches']} batches dropped",
        ),
        (
            "gap_recovery_max_ms",
            f"{r['gap_recovery_max_ms']:.1f} ms",
            f"{config['gap_rounds']} rounds",
        ),
        ("overrun_recovery_ms", f"{r['overrun_recovery_ms']:.1f} ms", overrun),
        (
            "overrun stale / missing blocks",
            f"{r['overrun_stale_blocks']} / {r['overrun_missing_blocks']}",
            f"of {r['overrun_engine_blocks']} held; pod degraded",
        ),
        (
            "  same, after more publishing",
            f"{r['overrun_stale_after_churn']} / {r['overrun_missing_after_churn']}",
            f"of {r['overrun_engine_blocks_after_churn']} held, after "
            f"{r['overrun_churn_batches']} more batches",
        ),
    ]
    print_table(
        f"kvgate subscriber: {config['engines']} engine processes + this subscriber process "
        f"sharing {config['cores']} cores",
        rows,
    )


def _plot(path: Path, gateway: _Gateway, results: dict[str, Any]) -> bool:
    plt = pyplot(path)
    figure, (live, burst, recovery) = plt.subplots(3, 1, figsize=(8, 9.5))
    _plot_phase(live, gateway, "live", "prepare")
    live.set_title(
        f"live: engines step the sim cache and publish "
        f"({results['live_events_per_s']:,.0f} events/s applied)",
        fontsize="medium",
    )
    _plot_phase(burst, gateway, "burst", "gaps")
    burst.set_title(
        f"burst: {results['config']['batches']} prepared batches per engine sent at once "
        f"({results['ingest_events_per_s']:,.0f} events/s applied)",
        fontsize="medium",
    )
    recoveries = results["gap_recovery_ms"]
    recovery.plot(range(1, len(recoveries) + 1), recoveries, "o", label="gap, repaired by replay")
    recovery.axhline(
        results["overrun_recovery_ms"], color="red", linestyle="--", label="replay buffer overrun"
    )
    recovery.set_title(
        f"recovery after {results['config']['gap_batches']} batches dropped", fontsize="medium"
    )
    recovery.set_xlabel("gap round")
    recovery.set_ylabel("recovery (ms)")
    recovery.set_ylim(bottom=0)
    recovery.grid(True, alpha=0.3)
    recovery.legend(fontsize="small")
    figure.suptitle(
        f"kvgate subscriber: {results['engines']} engine processes + 1 subscriber process, "
        f"{results['config']['cores']} cores"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def _plot_phase(axis: Any, gateway: _Gateway, first: str, until: str) -> None:
    """Events applied per pod from phase mark `first` to mark `until`, from 0 at its start."""
    marks = {label: at for at, label in gateway.phases}
    start, end = marks[first], marks[until]
    samples = [s for s in gateway.sink.samples if start <= s.at <= end]
    if not samples:
        return
    base = samples[0].events_by_pod
    for pod in sorted(base):
        axis.plot(
            [s.at - start for s in samples],
            [s.events_by_pod.get(pod, 0) - base[pod] for s in samples],
            label=pod,
        )
    axis.set_xlabel(f"seconds since the {first} phase started")
    axis.set_ylabel("events applied to the index")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small")
