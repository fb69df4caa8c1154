"""The live batches read from a pod's event socket, waiting to be applied in order.

One reader task puts, one session task takes. A take that finds the queue empty waits on
one future, woken by the next put, by the reader's end, or by a timer: no task and no
`asyncio.wait` per batch (they cost more than decoding and applying a small batch).
"""

from __future__ import annotations

import asyncio
from collections import deque


class LiveQueue:
    """Bounded FIFO of (seq, payload); `put` refuses (False) when full."""

    __slots__ = ("_items", "_maxsize", "_waiter")

    def __init__(self, maxsize: int) -> None:
        self._items: deque[tuple[int, bytes]] = deque()
        self._maxsize = maxsize
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: tuple[int, bytes]) -> bool:
        if len(self._items) >= self._maxsize:
            return False
        self._items.append(item)
        self.wake()
        return True

    def wake(self) -> None:
        """Wakes a waiting `take` (a put, or the reader stopped)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self, timeout_s: float) -> tuple[int, bytes] | None:
        """The oldest item; None when nothing came within `timeout_s` or `wake` was called
        with nothing to take."""
        if not self._items:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._items:
                return None
        return self._items.popleft()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
