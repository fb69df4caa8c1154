"""A one-line progress bar on stderr (`\r`-redrawn; off when stderr is not a terminal)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import TextIO

from bench.harness.streaming import RequestRecord

_WIDTH = 30


class ProgressBar:
    """`done(record)` after each request; `run()` redraws until cancelled."""

    def __init__(
        self, label: str, total: int, *, enabled: bool, stream: TextIO | None = None
    ) -> None:
        self.label = label
        self.total = max(total, 1)
        self.enabled = enabled
        self.count = 0
        self.errors = 0
        self._stream = stream or sys.stderr
        self._started = time.perf_counter()

    def done(self, record: RequestRecord) -> None:
        self.count += 1
        self.errors += record.error is not None

    def render(self) -> str:
        filled = round(_WIDTH * min(self.count, self.total) / self.total)
        bar = "#" * filled + "." * (_WIDTH - filled)
        elapsed = time.perf_counter() - self._started
        errors = f"  {self.errors} errors" if self.errors else ""
        return (
            f"{self.label:<13} [{bar}] {self.count}/{self.total} requests  {elapsed:5.1f} s{errors}"
        )

    async def run(self, period_s: float = 0.2) -> None:
        if not self.enabled:
            return
        try:
            while True:
                self._draw()
                await asyncio.sleep(period_s)
        finally:
            self._draw()
            self._stream.write("\n")
            self._stream.flush()

    def _draw(self) -> None:
        self._stream.write("\r" + self.render())
        self._stream.flush()


def stderr_is_tty() -> bool:
    with contextlib.suppress(AttributeError, ValueError):
        return sys.stderr.isatty()
    return False
