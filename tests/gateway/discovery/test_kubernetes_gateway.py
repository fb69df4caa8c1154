"""The gateway with Kubernetes discovery, end to end: `KVGATE_DISCOVERY=kubernetes`, a
kubeconfig pointing at the fake API server, and "pods" that are real simulated engines
(pod IP 127.0.0.1, port annotations naming the engines' HTTP, events and replay ports)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.control.discovery.kubepods import KV_EVENTS
from simulator import EngineServer
from tests.conftest import StartEngine
from tests.gateway.discovery.conftest import (
    MODEL,
    NAMESPACE,
    SELECTED,
    engine_pod,
    kube_gateway,
)
from tests.gateway.discovery.kubeapi import FakeKubeAPI, pod_object
from tests.gateway.discovery.test_kubernetes_watch import set_labels, set_ready
from tests.helpers import eventually, run_kvgate

ADMIN = {"authorization": "Bearer k8s-admin"}
ROUND_ROBIN = {"x-kvgate-policy": "round-robin"}
SYSTEM = "You answer questions about Kubernetes pods in great detail. " * 8  # several blocks


def sim_pod(server: EngineServer) -> dict[str, Any]:
    """A labelled pod whose address and port annotations are the engine's."""
    return engine_pod(server, {**SELECTED, KV_EVENTS: "true"}, ip="127.0.0.1")


@pytest.fixture
async def gateway(
    kube_api: FakeKubeAPI,
    start_engine: StartEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[httpx.AsyncClient]:
    for i in range(2):
        kube_api.create(NAMESPACE, sim_pod(await start_engine(name=f"e{i}")))
    env = {"KVGATE_DISCOVERY": "kubernetes", "KVGATE_K8S_NAMESPACES": NAMESPACE}
    async with kube_gateway(kube_api, tmp_path, monkeypatch, env) as client:
        yield client


async def pods(client: httpx.AsyncClient) -> dict[str, Any]:
    view = (await client.get("/admin/pods", headers=ADMIN)).json()["pods"]
    return {pod["name"]: pod for pod in view}


async def routed(client: httpx.AsyncClient, n: int = 6) -> set[str]:
    chosen = set()
    for i in range(n):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"q{i}"}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 2}
        # round-robin: every routable pod gets some of the requests
        response = await client.post("/v1/chat/completions", json=body, headers=ROUND_ROBIN)
        assert response.status_code == 200, response.text
        chosen.add(response.headers["x-kvgate-pod"])
    return chosen


def subscribed(view: dict[str, Any], name: str) -> bool:
    pod = view.get(name)
    return bool(pod and pod["subscriber"] and pod["subscriber"]["whole"])


async def test_labelled_pods_are_subscribed_and_routed_until_unlabelled_or_deleted(
    kube_api: FakeKubeAPI, gateway: httpx.AsyncClient
) -> None:
    client = gateway

    async def both_whole() -> bool:
        view = await pods(client)
        return subscribed(view, "e0") and subscribed(view, "e1")

    await eventually(both_whole, what="both pods subscribed, index whole")
    view = await pods(client)
    assert view["e0"]["index"] == "whole" and view["e0"]["ready"]
    assert view["e0"]["events"].startswith("tcp://127.0.0.1:")
    assert await routed(client, 12) == {"e0", "e1"}

    kube_api.update(NAMESPACE, "e1", set_labels(model=None))  # leaves the selector
    await eventually(lambda: _without(client, "e1"), what="e1 gone from the gateway")
    assert await routed(client) == {"e0"}

    async def indexed() -> bool:
        return bool((await pods(client))["e0"]["index_blocks"])

    await eventually(indexed, what="e0's events in the index")
    kube_api.update(NAMESPACE, "e0", set_labels(kv_events=None))
    await eventually(lambda: _unsubscribed(client, "e0"), what="e0's subscriber stopped")
    view = await pods(client)
    assert view["e0"]["index"] == "approximate" and view["e0"]["index_blocks"] == 0
    assert await routed(client, 2) == {"e0"}  # still routed, without events
    kube_api.update(NAMESPACE, "e0", set_labels(kv_events="true"))
    await eventually(lambda: _subscribed(client, "e0"), what="e0 subscribed again")

    kube_api.update(NAMESPACE, "e1", set_labels(model=MODEL))
    await eventually(lambda: _subscribed(client, "e1"), what="e1 back")
    kube_api.update(NAMESPACE, "e1", set_ready(False))

    async def not_ready() -> bool:
        return (await pods(client))["e1"]["ready"] is False

    await eventually(not_ready, what="e1 not ready")
    assert await _subscribed(client, "e1")  # not routed, but its index is kept up to date
    assert await routed(client) == {"e0"}

    kube_api.delete(NAMESPACE, "e0")
    await eventually(lambda: _without(client, "e0"), what="e0 deleted")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "anyone?"}]}
    assert (await client.post("/v1/chat/completions", json=body)).status_code >= 500
    kube_api.update(NAMESPACE, "e1", set_ready(True))

    async def ready_again() -> bool:  # it stayed subscribed while not ready: wait for Ready
        return (await pods(client))["e1"]["ready"] is True

    await eventually(ready_again, what="e1 ready again")
    assert await routed(client, 3) == {"e1"}

    metrics = (await client.get("/metrics")).text
    assert "kvgate_discovery_relists_total 0.0" in metrics
    assert "kvgate_discovery_errors_total 0.0" in metrics

    kube_api.hold_watches = asyncio.Event()  # expire the watch: the gateway lists again
    kube_api.drop_watches()
    kube_api.create(NAMESPACE, pod_object("web", labels={"app": "web"}))  # not selected
    kube_api.compact()  # the gateway's resourceVersion is now too old
    kube_api.hold_watches.set()

    async def relisted() -> bool:
        return "kvgate_discovery_relists_total 1.0" in (await client.get("/metrics")).text

    await eventually(relisted, what="the re-list counted")
    assert await routed(client, 3) == {"e1"}
    assert subscribed(await pods(client), "e1")


async def _without(client: httpx.AsyncClient, name: str) -> bool:
    return name not in await pods(client)


async def _subscribed(client: httpx.AsyncClient, name: str) -> bool:
    return subscribed(await pods(client), name)


async def _unsubscribed(client: httpx.AsyncClient, name: str) -> bool:
    view = await pods(client)
    return name in view and view[name]["subscriber"] is None


def test_serve_reports_a_missing_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    result = run_kvgate("serve", "--discovery", "kubernetes", timeout=60)
    assert result.returncode == 2
    assert "invalid configuration: KUBECONFIG=" in result.stderr
