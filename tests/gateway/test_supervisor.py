"""Background tasks are supervised: a failure is logged, counted and restarted with backoff;
a failure before the task ever worked (start-up) ends it with its error."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.app import create_app
from gateway.control.discovery import DiscoveryEvents, PodListener, StaticFileDiscovery
from gateway.control.supervisor import Supervisor
from gateway.http.server import GatewayServer
from gateway.settings import Settings
from tests.conftest import StartEngine
from tests.gateway.conftest import MODEL, StartGateway, pod_entry
from tests.helpers import eventually


def restarts_counter() -> Counter:
    return Counter("restarts", "restarts", ["task"], registry=CollectorRegistry())


async def test_a_failing_task_is_restarted_with_backoff_and_counted() -> None:
    counter = restarts_counter()
    supervisor = Supervisor(counter, backoff_s=0.05)
    runs: list[int] = []
    healthy = asyncio.Event()
    release = asyncio.Event()

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) <= 2:
            await asyncio.sleep(0)
            raise RuntimeError(f"crash {len(runs)}")
        healthy.set()
        await release.wait()

    supervisor.start("flaky", flaky)
    await eventually(lambda: "flaky" in supervisor.down, what="down after the first crash")
    await asyncio.wait_for(healthy.wait(), 10)
    assert runs == [0, 1, 2]
    assert supervisor.down == set()
    assert counter.labels("flaky")._value.get() == 2
    release.set()
    await supervisor.stop()


async def test_a_start_up_failure_is_not_restarted() -> None:
    supervisor = Supervisor(restarts_counter(), backoff_s=0.01)

    async def broken() -> None:
        raise ValueError("bad configuration")

    task = supervisor.start("discovery", broken, restart_if=lambda: False)
    with pytest.raises(ValueError, match="bad configuration"):
        await task
    await supervisor.stop()


async def test_ready_is_503_while_discovery_waits_for_its_restart(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        await eventually(lambda: _status(client, 200), what="ready")
        gw.state.background.down.add("discovery")  # as the supervisor marks a crashed task
        response = await client.get("/ready")
        assert response.status_code == 503 and "restarting" in response.json()["reason"]
        gw.state.background.down.discard("discovery")
        assert (await client.get("/ready")).status_code == 200
        page = (await client.get("/metrics")).text
    assert "kvgate_background_restarts_total" in page or "kvgate_background_restarts" in page


async def _status(client: object, code: int) -> bool:
    return (await client.get("/ready")).status_code == code  # type: ignore[attr-defined]


class BreakableDiscovery:
    """The real file discovery, failing (as a bug or a revoked permission would) once
    `broken` is set: at once while it stays set, including in every restarted run."""

    def __init__(self, path: Path, events: DiscoveryEvents) -> None:
        self._inner = StaticFileDiscovery(path, poll_interval_s=0.1, events=events)
        self.broken = asyncio.Event()

    def request_reload(self) -> None:
        self._inner.request_reload()

    async def run(self, listener: PodListener, ready: asyncio.Event) -> None:
        if self.broken.is_set():
            raise RuntimeError("discovery failed")
        inner = asyncio.ensure_future(self._inner.run(listener, ready))
        try:
            await self.broken.wait()
        finally:
            inner.cancel()
        raise RuntimeError("discovery failed")


async def test_a_pod_that_left_while_discovery_was_down_is_removed_on_its_restart(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engines = [await start_engine(name=f"e{i}") for i in range(2)]
    pods_file = tmp_path / "pods.json"
    pods_file.write_text(json.dumps({"pods": [pod_entry(engine) for engine in engines]}))
    made: list[BreakableDiscovery] = []

    def breakable(events: DiscoveryEvents) -> BreakableDiscovery:
        made.append(BreakableDiscovery(pods_file, events))
        return made[-1]

    app = create_app(
        Settings(pods_file=pods_file, scrape_interval_s=0.2, kv_event_sync=False),
        discovery=breakable,
        metrics_registry=CollectorRegistry(),
    )
    server = GatewayServer(app)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            await eventually(lambda: _status(client, 200), what="ready")
            registry = app.state.gateway.registry
            (discovery,) = made
            assert sorted(state.name for state in registry.all()) == ["e0", "e1"]
            discovery.broken.set()
            await eventually(lambda: _status(client, 503), what="unready while down")
            pods_file.write_text(json.dumps({"pods": [pod_entry(engines[0])]}))  # e1 left
            discovery.broken.clear()
            await eventually(lambda: _status(client, 200), within=15, what="ready again")
            assert [state.name for state in registry.all()] == ["e0"]
            answer = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}
            )
            assert answer.status_code == 200 and answer.headers["x-kvgate-pod"] == "e0"
    finally:
        await server.stop()
