"""How late the demo's event loop runs a timer: the gateway and the load generator share
this loop, so a late timer is time added to every measured latency."""

from __future__ import annotations

import asyncio
import time

from bench.results_io import percentile


class LoopLagProbe:
    """`run()` until cancelled; `lags_s` holds how late each `period_s` sleep woke up."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.lags_s: list[float] = []

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.lags_s.append(max(0.0, time.perf_counter() - started - self.period_s))

    def summary_ms(self) -> dict[str, float]:
        return {
            "p50": percentile(self.lags_s, 50) * 1e3,
            "p99": percentile(self.lags_s, 99) * 1e3,
            "max": max(self.lags_s, default=float("nan")) * 1e3,
        }
