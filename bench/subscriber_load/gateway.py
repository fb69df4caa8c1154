"""The gateway side, in this process: the subscriber manager feeding a counting index sink,
and a probe of the event loop's stalls."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench.harness.probe import LoopLagProbe
from bench.harness.readiness import subscriber_live, until
from bench.subscriber_load.engines import CATCH_UP_TIMEOUT_S
from indexer import SyncPrefixHashTable
from subscriber import IndexSink, KVEventBatch, Phase, SubscriberManager
from subscriber.events import AllBlocksCleared as DecodedCleared

PROBE_INTERVAL_S = 0.005


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
class Gateway:
    manager: SubscriberManager
    sink: CountingSink
    t0: float
    probe: LoopLagProbe = field(init=False)
    """How late a task asking to wake every few ms is woken (event-loop stalls)."""
    marks: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since start, recovery ms) of each gap injected."""
    phases: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.probe = LoopLagProbe(PROBE_INTERVAL_S, self._woke)

    def _woke(self, now: float) -> None:
        if len(self.probe.lags) % 20 == 0:
            self.sink.sample(now)

    @property
    def table(self) -> SyncPrefixHashTable:
        return self.sink.table

    def max_lag_ms(self, start: float, end: float) -> float:
        """The longest stall of the event loop that ended within [start, end]."""
        return self.probe.max_lag_ms(start, end)

    async def wait_seq(self, pod: str, seq: int, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """Until the pod's subscriber has applied `seq` and is live again."""

        def reached() -> bool:
            status = self.manager.status(pod)
            return status is not None and status.last_seq == seq and status.phase is Phase.LIVE

        await until(reached, f"{pod} at seq {seq}", timeout_s, 0.0005)

    async def wait_live(self, pod: str) -> None:
        live = functools.partial(subscriber_live, self.manager, pod)
        await until(live, f"the subscriber of {pod} live", 30.0, 0.01)

    def mark(self, label: str) -> None:
        self.phases.append((time.monotonic() - self.t0, label))
        self.sink.sample()

    def diff(self, pod: str, resident: list[int]) -> tuple[int, int]:
        """(stale, missing): blocks the index holds that the engine does not, and back."""
        held = self.table.dump(pod)
        engine = set(resident)
        return len(held - engine), len(engine - held)
