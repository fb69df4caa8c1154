"""Fixtures: a fake Kubernetes API server on loopback and a discovery watching it."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from gateway.control.discovery import Discovery, DiscoveryEvents
from gateway.control.discovery.inferencepool import InferencePoolDiscovery
from gateway.control.discovery.kubernetes import KubernetesDiscovery, load_api_client
from gateway.control.discovery.kubewatch import WatchTiming
from tests.gateway.discovery.kubeapi import TOKEN, FakeKubeAPI
from tests.gateway.discovery_listener import RecordingListener

NAMESPACE = "inference"
MODEL = "sim-model"
SELECTED = {"model.aibrix.ai/name": MODEL}
POOL = "llama-pool"
# Short server timeouts and backoffs: a test sees several watch renewals and retries.
FAST = WatchTiming(
    watch_timeout_s=5,
    connect_timeout_s=2.0,
    read_slack_s=5.0,
    page_size=2,
    backoff_initial_s=0.05,
    backoff_max_s=0.2,
)


D = TypeVar("D", bound=Discovery)


@dataclass
class Watching(Generic[D]):
    discovery: D
    listener: RecordingListener
    task: asyncio.Task[None]
    ready: asyncio.Event
    errors: list[Exception] = field(default_factory=list)

    async def stop(self) -> None:
        if self.task.done():
            return  # ended by its own error, which the test has seen
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


StartDiscovery = Callable[..., Awaitable[Watching[KubernetesDiscovery]]]
StartPool = Callable[..., Awaitable[Watching[InferencePoolDiscovery]]]


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kvgate-k8s-watch-")]


@pytest.fixture
async def kube_api() -> AsyncIterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    await api.server.start()
    yield api
    if api.hold_watches is not None:
        api.hold_watches.set()
    api.drop_watches()
    await api.server.stop()


async def _run(discovery: D, errors: list[Exception], *, wait_ready: bool) -> Watching[D]:
    listener = RecordingListener()
    ready = asyncio.Event()
    task = asyncio.create_task(discovery.run(listener, ready))
    watching = Watching(discovery, listener, task, ready, errors)
    if wait_ready:
        waiter = asyncio.ensure_future(ready.wait())
        try:
            done, _ = await asyncio.wait(
                {task, waiter}, timeout=10, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        if task in done:
            await watching.stop()  # the test sees its error below
            task.result()
        assert ready.is_set(), "discovery did not list within 10 s"
    return watching


@pytest.fixture
async def start_discovery(kube_api: FakeKubeAPI, tmp_path: Path) -> AsyncIterator[StartDiscovery]:
    """Run a KubernetesDiscovery (real client, kubeconfig in tmp_path) into a listener."""
    running: list[Watching[KubernetesDiscovery]] = []

    async def start(
        namespaces: tuple[str, ...] = (NAMESPACE,),
        *,
        wait_ready: bool = True,
        token: str = TOKEN,
        **kwargs: Any,
    ) -> Watching[KubernetesDiscovery]:
        kubeconfig = kube_api.kubeconfig(tmp_path, token=token)
        client = load_api_client({"KUBECONFIG": str(kubeconfig)})
        errors: list[Exception] = []
        discovery = KubernetesDiscovery(
            client,
            namespaces=namespaces,
            timing=kwargs.pop("timing", FAST),
            rng=random.Random(7),
            events=DiscoveryEvents(error=errors.append),
            close_client=True,
            **kwargs,
        )
        running.append(await _run(discovery, errors, wait_ready=wait_ready))
        return running[-1]

    yield start
    for watching in running:
        await watching.stop()


@pytest.fixture
async def start_pool(kube_api: FakeKubeAPI, tmp_path: Path) -> AsyncIterator[StartPool]:
    """Run an InferencePoolDiscovery (real client) on pool `name` into a listener."""
    running: list[Watching[InferencePoolDiscovery]] = []

    async def start(
        name: str = POOL, *, wait_ready: bool = True
    ) -> Watching[InferencePoolDiscovery]:
        client = load_api_client({"KUBECONFIG": str(kube_api.kubeconfig(tmp_path))})
        errors: list[Exception] = []
        discovery = InferencePoolDiscovery(
            client,
            namespace=NAMESPACE,
            name=name,
            timing=FAST,
            rng=random.Random(7),
            events=DiscoveryEvents(error=errors.append),
            close_client=True,
        )
        running.append(await _run(discovery, errors, wait_ready=wait_ready))
        return running[-1]

    yield start
    for watching in running:
        await watching.stop()
