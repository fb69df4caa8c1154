"""How late an event loop runs a timer: everything else that loop runs (a gateway, a load
generator, a subscriber) is late by as much."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from bench.results_io import percentile


class LoopLagProbe:
    """Sleeps `period_s` again and again while `running()`; `lags` holds (monotonic time
    of the wake-up, seconds late) for each; `on_wake(now)` runs after each."""

    def __init__(
        self, period_s: float = 0.01, on_wake: Callable[[float], None] = lambda now: None
    ) -> None:
        self.period_s = period_s
        self.lags: list[tuple[float, float]] = []
        self._on_wake = on_wake

    async def run(self) -> None:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(self.period_s)
            now = time.monotonic()
            self.lags.append((now, now - asked - self.period_s))
            self._on_wake(now)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LoopLagProbe]:
        task = asyncio.create_task(self.run(), name="loop-lag-probe")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def summary_ms(self) -> dict[str, float]:
        lags = [max(0.0, lag) for _, lag in self.lags]
        return {
            "p50": percentile(lags, 50) * 1e3,
            "p99": percentile(lags, 99) * 1e3,
            "max": max(lags, default=float("nan")) * 1e3,
        }

    def max_lag_ms(self, start: float, end: float) -> float:
        """The longest stall that ended within [start, end] (monotonic times)."""
        return max((lag for at, lag in self.lags if start <= at <= end), default=0.0) * 1e3
