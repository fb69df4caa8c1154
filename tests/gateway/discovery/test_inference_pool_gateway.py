"""The gateway with InferencePool discovery, end to end: `KVGATE_DISCOVERY=inference-pool`,
a kubeconfig pointing at the fake API server, a pool whose target port is the port two
real simulated engines listen on (each on its own loopback address, as pods have their
own IPs), and their KV events subscribed by the usual label opt-in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.control.discovery import DiscoveryEvents, InferencePoolDiscovery, build_discovery
from gateway.control.discovery.kubepods import KV_EVENTS
from gateway.control.discovery.kubepods import MODEL as MODEL_LABEL
from gateway.errors import ConfigError
from gateway.settings import Settings
from simulator import EngineServer
from tests.conftest import StartEngine
from tests.gateway.discovery.conftest import MODEL, NAMESPACE, POOL, engine_pod, kube_gateway
from tests.gateway.discovery.kubeapi import POOLS, FakeKubeAPI, pool_object
from tests.gateway.discovery.test_kubernetes_gateway import ADMIN, pods, routed, subscribed
from tests.helpers import eventually

HOSTS = ("127.0.0.2", "127.0.0.3")


def pool_pod(server: EngineServer, app: str) -> dict[str, Any]:
    """The engine as a pod of the pool's selection at its own address; its HTTP port is the
    pool's target port."""
    host = urlsplit(server.url).hostname
    assert host is not None
    labels = {"app": app, MODEL_LABEL: MODEL, KV_EVENTS: "true"}
    return engine_pod(server, labels, ip=host, http_port=False)


async def engines_on_one_port(start_engine: StartEngine) -> list[EngineServer]:
    """Two engines on the same port of two loopback addresses (retried if the second
    address has that port taken)."""
    for _ in range(5):
        first = await start_engine(name="e0", host=HOSTS[0], port=0,
                                   events_endpoint=f"tcp://{HOSTS[0]}:0",
                                   replay_endpoint=f"tcp://{HOSTS[0]}:0")  # fmt: skip
        try:
            second = await start_engine(name="e1", host=HOSTS[1], port=first.port,
                                        events_endpoint=f"tcp://{HOSTS[1]}:0",
                                        replay_endpoint=f"tcp://{HOSTS[1]}:0")  # fmt: skip
        except OSError:
            await first.stop()
            continue
        return [first, second]
    raise AssertionError("no port free on both loopback addresses")


@pytest.fixture
async def gateway(
    kube_api: FakeKubeAPI,
    start_engine: StartEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[httpx.AsyncClient]:
    servers = await engines_on_one_port(start_engine)
    kube_api.create(NAMESPACE, pool_pod(servers[0], "vllm"))
    kube_api.create(NAMESPACE, pool_pod(servers[1], "vllm-canary"))
    pool = pool_object(POOL, match_labels={MODEL_LABEL: MODEL}, ports=(servers[0].port,))
    kube_api.create(NAMESPACE, pool, resource=POOLS)
    env = {"KVGATE_DISCOVERY": "inference-pool", "KVGATE_INFERENCE_POOL": f"{NAMESPACE}/{POOL}"}
    async with kube_gateway(kube_api, tmp_path, monkeypatch, env) as client:
        yield client


async def test_the_pools_pods_are_subscribed_and_routed_as_the_pool_changes(
    kube_api: FakeKubeAPI, gateway: httpx.AsyncClient
) -> None:
    client = gateway

    async def whole(*names: str) -> bool:
        view = await pods(client)
        return sorted(view) == sorted(names) and all(subscribed(view, n) for n in names)

    await eventually(lambda: whole("e0", "e1"), what="both pods subscribed, index whole")
    assert await routed(client, 12) == {"e0", "e1"}
    view = (await client.get("/admin/pods", headers=ADMIN)).json()["pods"]
    assert {pod["url"].rsplit(":", 1)[0] for pod in view} == {f"http://{h}" for h in HOSTS}

    def narrowed(pool: dict[str, Any]) -> None:
        pool["spec"]["selector"]["matchLabels"]["app"] = "vllm"

    kube_api.update(NAMESPACE, POOL, narrowed, resource=POOLS)  # the canary leaves
    await eventually(lambda: whole("e0"), what="e1 gone with the new selector")
    assert await routed(client) == {"e0"}

    kube_api.delete(NAMESPACE, POOL, resource=POOLS)
    await eventually(lambda: whole(), what="no pods without the pool")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "anyone?"}]}
    answer = await client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 404, answer.text  # no pod serves the model any more
    metrics = (await client.get("/metrics")).text
    assert "kvgate_discovery_errors_total 0.0" in metrics


async def test_the_source_needs_a_pool(
    kube_api: FakeKubeAPI, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = Settings.load({"KVGATE_DISCOVERY": "inference-pool"})
    with pytest.raises(ConfigError, match="KVGATE_INFERENCE_POOL"):
        build_discovery(settings, events=DiscoveryEvents())
    with pytest.raises(ConfigError, match="KVGATE_INFERENCE_POOL='Team/pool'"):
        Settings.load({"KVGATE_INFERENCE_POOL": "Team/pool"})
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kube_api.kubeconfig(tmp_path)))
    for reference, namespace in (("team-a/llama", "team-a"), ("llama", "default")):
        env = {"KVGATE_DISCOVERY": "inference-pool", "KVGATE_INFERENCE_POOL": reference}
        discovery = build_discovery(Settings.load(env), events=DiscoveryEvents())
        assert isinstance(discovery, InferencePoolDiscovery)
        assert (discovery.namespace, discovery.name) == (namespace, "llama")
