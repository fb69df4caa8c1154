"""Samples the gateway process every few seconds: RSS, open file descriptors (from /proc)
and asyncio tasks (its `kvgate_process_asyncio_tasks` gauge on /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.gateway import GatewayProcess
from bench.harness.processes import open_fds, rss_bytes

_TASKS = re.compile(rb"^kvgate_process_asyncio_tasks (\S+)$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    """Seconds since the run started."""
    pid: int
    rss_bytes: int
    open_fds: int | None
    asyncio_tasks: int | None

    def as_json(self, *, pid: bool = True) -> dict[str, Any]:
        return {"t": round(self.t, 2), **({"pid": self.pid} if pid else {}),
                "rss_mb": round(self.rss_bytes / 2**20, 2), "open_fds": self.open_fds,
                "asyncio_tasks": self.asyncio_tasks}  # fmt: skip


@dataclass
class ProcessSampler:
    gateway: GatewayProcess
    interval_s: float
    started: float
    clock: Callable[[], float] = time.monotonic
    samples: list[Sample] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client:
            while not stop.is_set():
                await self.sample(client)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)

    async def sample(self, client: httpx.AsyncClient) -> None:
        pid = self.gateway.pid
        if pid is None:
            return
        tasks: int | None = None
        with contextlib.suppress(httpx.HTTPError):
            match = _TASKS.search((await client.get(f"{self.gateway.url}/metrics")).content)
            tasks = int(float(match.group(1))) if match else None
        rss = rss_bytes(pid)
        if rss is None:
            return
        self.samples.append(Sample(self.clock() - self.started, pid, rss, open_fds(pid), tasks))


def slope_per_minute(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute; 0 with < 2 points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60.0
