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
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.control.discovery import Discovery, DiscoveryEvents
from gateway.control.discovery.inferencepool import InferencePoolDiscovery
from gateway.control.discovery.kubepods import EVENTS_PORT, HTTP_PORT, REPLAY_PORT, TOPIC
from gateway.control.discovery.kubernetes import KubernetesDiscovery, load_api_client
from gateway.control.discovery.kubewatch import WatchTiming
from gateway.http.server import GatewayServer
from gateway.settings import Settings
from simulator import EngineServer
from tests.gateway.discovery.kubeapi import TOKEN, FakeKubeAPI, pod_object
from tests.gateway.discovery_listener import RecordingListener
from tests.helpers import eventually

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


def engine_pod(
    server: EngineServer, labels: dict[str, str], *, ip: str, http_port: bool = True
) -> dict[str, Any]:
    """A pod object for a simulated engine: its address, and annotations naming its events
    and replay ports and its topic (and its HTTP port, unless `http_port` is false: an
    InferencePool's target port gives it)."""
    publisher = server.engine.publisher
    assert publisher.replay_endpoint is not None
    annotations = {
        EVENTS_PORT: publisher.events_endpoint.rsplit(":", 1)[1],
        REPLAY_PORT: publisher.replay_endpoint.rsplit(":", 1)[1],
        TOPIC: server.engine.config.topic,
    }
    if http_port:
        annotations[HTTP_PORT] = str(urlsplit(server.url).port)
    return pod_object(server.engine.config.name, labels=labels, annotations=annotations, ip=ip)


@contextlib.asynccontextmanager
async def kube_gateway(
    kube_api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    """`kvgate serve`'s app with `env`'s discovery settings, its kubeconfig pointing at the
    fake API server; a client to it. At the end the lifespan has stopped discovery: its
    watch threads end and its watches close although their timeout is 30 s."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a cluster
    monkeypatch.setenv("KUBECONFIG", str(kube_api.kubeconfig(tmp_path)))
    settings = Settings.load(
        {**env, "KVGATE_ADMIN_TOKEN": "k8s-admin", "KVGATE_SCRAPE_INTERVAL": "0.2"}
    )
    server = GatewayServer(create_app(settings, metrics_registry=CollectorRegistry()))
    await server.start()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client
    await server.stop()
    await eventually(lambda: watch_threads() == [], what="the watch threads ended")
    await eventually(lambda: kube_api.open_watches() == 0, what="the watches closed")


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
