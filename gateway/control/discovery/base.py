"""The discovery interface: sources report pods; the registry listens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from gateway.control.discovery.pods import Pod

logger = logging.getLogger(__name__)


class PodListener(Protocol):
    """Receives a source's view of the fleet, one change at a time."""

    async def upsert_pod(self, pod: Pod) -> None:
        """A pod appeared or changed (address, readiness, model, LoRAs...)."""

    async def remove_pod(self, name: str) -> None:
        """A pod is gone (deleted, or no longer selected)."""


def _ignore_error(error: Exception) -> None:
    pass


def _ignore() -> None:
    pass


@dataclass(frozen=True, slots=True)
class DiscoveryEvents:
    """What a source reports besides pods, for the gateway's counters: each failure it
    recovers from (`kvgate_discovery_errors_total`) and each full relist
    (`kvgate_discovery_relists_total`)."""

    error: Callable[[Exception], None] = _ignore_error
    relist: Callable[[], None] = _ignore


class Discovery(Protocol):
    """A source of pods (a static file, the Kubernetes API...), built from the settings by
    `gateway.control.discovery.sources.build_discovery`.

    `run` reports the initial set, sets `ready`, then keeps reporting changes until it is
    cancelled. It must not raise for a transient failure (retry, keep the last good view,
    tell the `DiscoveryEvents` it was built with); it raises only if the first load is
    impossible (bad configuration).
    """

    async def run(self, listener: PodListener, ready: asyncio.Event) -> None: ...

    def request_reload(self) -> None:
        """Look again now (SIGHUP): a source that follows its changes as they happen may
        ignore it."""


DiscoveryFactory = Callable[[DiscoveryEvents], Discovery]
"""Builds a discovery source that reports to the given events (`create_app`'s `discovery`)."""


async def sync_pods(listener: PodListener, current: dict[str, Pod], wanted: list[Pod]) -> None:
    """Report the difference between the pods reported so far and `wanted`; updates `current`."""
    wanted_by_name = {pod.name: pod for pod in wanted}
    for name in [name for name in current if name not in wanted_by_name]:
        del current[name]
        await listener.remove_pod(name)
    for name, pod in wanted_by_name.items():
        if current.get(name) != pod:
            current[name] = pod
            await listener.upsert_pod(pod)


class _ReportedNames:
    """Passes a discovery run's reports on, remembering which pods it reported."""

    def __init__(self, listener: PodListener) -> None:
        self._listener = listener
        self.names: set[str] = set()

    async def upsert_pod(self, pod: Pod) -> None:
        self.names.add(pod.name)
        await self._listener.upsert_pod(pod)

    async def remove_pod(self, name: str) -> None:
        self.names.discard(name)
        await self._listener.remove_pod(name)


async def run_resynced(
    discovery: Discovery,
    listener: PodListener,
    known: Callable[[], Iterable[str]],
    ready: asyncio.Event,
) -> None:
    """One discovery run that, once its first load is in, removes the pods the listener
    still `known`s but the run did not report. A run restarted after a failure starts from
    nothing: without this, a pod that left while discovery was down would stay routable.
    `ready` is set after that first load (and stays set across restarts)."""
    reported = _ReportedNames(listener)
    loaded = asyncio.Event()
    run = asyncio.ensure_future(discovery.run(reported, loaded))
    try:
        waiter = asyncio.ensure_future(loaded.wait())
        try:
            await asyncio.wait({run, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not loaded.is_set():
            run.result()  # its error
            raise RuntimeError("discovery ended before its first load")
        for name in [name for name in known() if name not in reported.names]:
            logger.info("pod %s left while discovery was down: removed", name)
            await listener.remove_pod(name)
        ready.set()
        await run
    finally:
        if not run.done():
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
