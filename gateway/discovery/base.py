"""The discovery interface: sources report pods; the registry listens."""

from __future__ import annotations

import asyncio
from typing import Protocol

from gateway.discovery.pods import Pod


class PodListener(Protocol):
    """Receives a source's view of the fleet, one change at a time."""

    async def upsert_pod(self, pod: Pod) -> None:
        """A pod appeared or changed (address, readiness, model, LoRAs...)."""

    async def remove_pod(self, name: str) -> None:
        """A pod is gone (deleted, or no longer selected)."""


class Discovery(Protocol):
    """A source of pods (a static file, the Kubernetes API...).

    `run` reports the initial set, sets `ready`, then keeps reporting changes until it is
    cancelled. It must not raise for a transient failure (retry, keep the last good view);
    it raises only if the first load is impossible (bad configuration).
    """

    async def run(self, listener: PodListener, ready: asyncio.Event) -> None: ...


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
