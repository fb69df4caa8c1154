"""Background tasks are supervised: a failure is logged, counted and restarted with backoff;
a failure before the task ever worked (start-up) ends it with its error."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.supervisor import Supervisor
from tests.gateway.conftest import StartGateway
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
