"""The gateway's background tasks, supervised: restarted with backoff when they fail."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import Counter

logger = logging.getLogger(__name__)

_RESTART_BACKOFF_S = 0.5
_MAX_RESTART_BACKOFF_S = 30.0


class Supervisor:
    """Named background tasks with hard references, supervised: a task that fails is logged
    once, counted (`kvgate_background_restarts_total{task}`) and restarted with exponential
    backoff; `down` names the ones waiting for their restart. Stopped in reverse start
    order."""

    def __init__(
        self, restarts: Counter | None = None, *, backoff_s: float = _RESTART_BACKOFF_S
    ) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self._restarts = restarts
        self._backoff_s = backoff_s
        self.down: set[str] = set()

    def start(
        self,
        name: str,
        work: Callable[[], Coroutine[Any, Any, None]],
        *,
        restart_if: Callable[[], bool] = lambda: True,
    ) -> asyncio.Task[None]:
        """Run `work()` until cancelled. If it fails and `restart_if()` says so, run it
        again after a backoff; otherwise the task ends with its error (start-up failures)."""
        if self._restarts is not None:
            self._restarts.labels(name)  # at 0 until its first restart
        task = asyncio.create_task(self._supervise(name, work, restart_if), name=f"kvgate-{name}")
        self._tasks.append(task)
        return task

    async def _supervise(
        self,
        name: str,
        work: Callable[[], Coroutine[Any, Any, None]],
        restart_if: Callable[[], bool],
    ) -> None:
        backoff = self._backoff_s
        while True:
            try:
                await work()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                if not restart_if():
                    logger.exception("background task %s failed", name)
                    raise
                logger.exception("background task %s failed; restarting in %.1f s", name, backoff)
            self.down.add(name)
            if self._restarts is not None:
                self._restarts.labels(name).inc()
            try:
                await asyncio.sleep(backoff)
            finally:
                self.down.discard(name)
            backoff = min(backoff * 2, _MAX_RESTART_BACKOFF_S)

    async def stop(self) -> None:
        for task in reversed(self._tasks):
            task.cancel()
        for task in reversed(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
