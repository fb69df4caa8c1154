"""Counting rejected frames per pod and reason, and rate-limiting the log lines about them.

A frame that cannot be decoded is skipped: the subscriber records it here, logs it only
when `RejectCounter.record` says so (at most once per pod per interval, with the number of
rejections left unlogged since the previous line), and keeps its connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RejectVerdict:
    """What the caller should do about one rejection it just recorded."""

    should_log: bool
    suppressed: int
    """When `should_log`: rejections of this pod not logged since its previous log line."""


@dataclass(slots=True)
class _PodLog:
    last_logged: float
    suppressed: int = 0


class RejectCounter:
    """Counts rejections per (pod, reason); decides when a rejection may be logged.

    Plain counters (the gateway exports them as metrics); the clock is injected so tests
    control the log interval. Not thread-safe: use it from the event loop.
    """

    def __init__(
        self, *, log_interval: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if log_interval < 0:
            raise ValueError(f"log_interval must be >= 0, got {log_interval!r}")
        self._log_interval = log_interval
        self._clock = clock
        self._counts: dict[tuple[str, str], int] = {}
        self._logs: dict[str, _PodLog] = {}

    def record(self, pod: str, reason: str) -> RejectVerdict:
        """Count one rejected frame of `pod` and say whether to log it now."""
        key = (pod, reason)
        self._counts[key] = self._counts.get(key, 0) + 1
        now = self._clock()
        log = self._logs.get(pod)
        if log is None:
            self._logs[pod] = _PodLog(now)
            return RejectVerdict(True, 0)
        if now - log.last_logged >= self._log_interval:
            suppressed = log.suppressed
            log.last_logged = now
            log.suppressed = 0
            return RejectVerdict(True, suppressed)
        log.suppressed += 1
        return RejectVerdict(False, 0)

    def count(self, pod: str | None = None, reason: str | None = None) -> int:
        """Rejections so far, optionally of one pod and/or one reason."""
        return sum(
            n
            for (p, r), n in self._counts.items()
            if (pod is None or p == pod) and (reason is None or r == reason)
        )

    def snapshot(self) -> dict[tuple[str, str], int]:
        """A copy of the counters: (pod, reason) -> rejections since start."""
        return dict(self._counts)

    def forget(self, pod: str) -> None:
        """Drop a pod's counters and log state (when it leaves the fleet)."""
        self._logs.pop(pod, None)
        for key in [k for k in self._counts if k[0] == pod]:
            del self._counts[key]
