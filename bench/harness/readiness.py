"""Waiting for something to become true: a child answering HTTP, a condition polled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx

from bench.harness.processes import ChildProcess
from subscriber import Phase, SubscriberManager

T = TypeVar("T")


class StartError(RuntimeError):
    """A child did not start or did not become ready (its log tail is in the message)."""


async def eventually(
    check: Callable[[], Awaitable[T]],
    what: str,
    timeout_s: float = 60.0,
    interval_s: float = 0.05,
) -> T:
    """`check()` until it returns something true, which is returned; TimeoutError after
    `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                if result := await check():
                    return result
                await asyncio.sleep(interval_s)
    except TimeoutError:
        raise TimeoutError(f"{what} not reached within {timeout_s} s") from None


async def until(
    check: Callable[[], object], what: str, timeout_s: float = 60.0, interval_s: float = 0.05
) -> None:
    """Until the synchronous `check()` is true; TimeoutError after `timeout_s`."""

    async def test() -> bool:
        return bool(check())

    await eventually(test, what, timeout_s, interval_s)


def subscriber_live(manager: SubscriberManager, pod: str) -> bool:
    """Whether an in-process subscriber of `pod` is live and connected."""
    status = manager.status(pod)
    return status is not None and status.phase is Phase.LIVE and status.connected


async def wait_http(
    url: str,
    child: ChildProcess | None = None,
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
    accept: Callable[[httpx.Response], bool] = lambda response: True,
) -> None:
    """Until GET `url` answers 200 and `accept`s the answer; StartError if `child` exits
    first or the time runs out."""
    name = child.name if child is not None else url
    async with httpx.AsyncClient(timeout=2.0) as client:
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    if child is not None and child.exited:
                        raise StartError(f"{name} exited on start-up:\n{child.log_tail()}")
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        response = await client.get(url)
                        if response.status_code == 200 and accept(response):
                            return
                    await asyncio.sleep(interval_s)
        except TimeoutError:
            tail = child.log_tail() if child is not None else ""
            raise StartError(f"{name} not ready after {timeout_s} s:\n{tail}") from None
