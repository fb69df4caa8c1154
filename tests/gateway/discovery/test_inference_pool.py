"""InferencePoolDiscovery with the real `kubernetes` client against the fake API server:
pool → pods → endpoints per target port, a pool that changes (selector, ports), is
deleted or malformed, pods joining and leaving, 410 Gone, configuration mistakes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.control.discovery import Pod
from gateway.control.discovery.kubepods import KV_EVENTS
from gateway.control.discovery.kubepods import MODEL as MODEL_LABEL
from gateway.errors import ConfigError
from tests.gateway.discovery.conftest import MODEL, NAMESPACE, POOL, StartPool, watch_threads
from tests.gateway.discovery.kubeapi import POOLS, FakeKubeAPI, pod_object, pool_object
from tests.helpers import eventually


def engine(name: str, ip: str, *, events: bool = False, **labels: str) -> dict[str, Any]:
    """A model-server pod labelled for a pool (`app=vllm` unless told otherwise)."""
    all_labels = {"app": "vllm", MODEL_LABEL: MODEL, **labels}
    if events:
        all_labels[KV_EVENTS] = "true"
    return pod_object(name, labels=all_labels, ip=ip, ports={"http": 8080})


def make_pool(kube_api: FakeKubeAPI, **kwargs: Any) -> None:
    kube_api.create(NAMESPACE, pool_object(POOL, **kwargs), resource=POOLS)


def change_pool(kube_api: FakeKubeAPI, change: Any) -> None:
    kube_api.update(NAMESPACE, POOL, change, resource=POOLS)


def spec_set(**fields: Any) -> Any:
    def change(pool: dict[str, Any]) -> None:
        pool["spec"].update(fields)

    return change


def selector(**labels: str) -> dict[str, Any]:
    return {"matchLabels": labels}


def ports(*numbers: int) -> list[dict[str, int]]:
    return [{"number": n} for n in numbers]


def urls(pods: dict[str, Pod]) -> dict[str, str]:
    return {name: pod.url for name, pod in pods.items()}


async def test_the_pools_pods_become_endpoints_on_its_target_port(
    kube_api: FakeKubeAPI, start_pool: StartPool
) -> None:
    make_pool(kube_api, match_labels={"app": "vllm"}, ports=(8000,))
    kube_api.create(NAMESPACE, engine("vllm-0", "10.0.0.1", events=True))
    kube_api.create(NAMESPACE, engine("vllm-1", "10.0.0.2"))
    kube_api.create(NAMESPACE, engine("web", "10.0.0.3", app="web"))
    kube_api.create("elsewhere", engine("vllm-x", "10.0.0.4"))
    kube_api.create(NAMESPACE, pod_object("pending", labels={"app": "vllm"}, ip=None,
                                          phase="Pending", ready=False))  # fmt: skip

    watching = await start_pool()

    pods = watching.listener.pods
    # The pool's target port, not the pod's own `http` container port (8080).
    assert urls(pods) == {"vllm-0": "http://10.0.0.1:8000", "vllm-1": "http://10.0.0.2:8000"}
    assert pods["vllm-0"].events == "tcp://10.0.0.1:5557"  # the same KV-event opt-in label
    assert pods["vllm-0"].replay == "tcp://10.0.0.1:5558"
    assert pods["vllm-1"].events is None and pods["vllm-1"].model == MODEL
    assert all(pod.ready for pod in pods.values())
    [pool_list] = kube_api.lists(POOLS)
    assert pool_list["fieldSelector"] == f"metadata.name={POOL}"
    [pod_list] = kube_api.lists()
    assert pod_list["labelSelector"] == "app=vllm"
    await eventually(lambda: kube_api.open_watches() == 2, what="pool and pod watches")
    assert watching.errors == [] and watching.discovery.relists == 0


async def test_several_target_ports_are_one_endpoint_each_with_its_ranks_events(
    kube_api: FakeKubeAPI, start_pool: StartPool
) -> None:
    make_pool(kube_api, ports=(8000, 8001))
    kube_api.create(NAMESPACE, engine("dp", "10.0.0.1", events=True))
    watching = await start_pool()
    pods = watching.listener.pods
    assert urls(pods) == {"dp-rank-0": "http://10.0.0.1:8000", "dp-rank-1": "http://10.0.0.1:8001"}
    assert (pods["dp-rank-1"].events, pods["dp-rank-1"].replay) == (
        "tcp://10.0.0.1:5558",
        "tcp://10.0.0.1:5559",
    )

    change_pool(kube_api, spec_set(targetPorts=ports(9000)))  # one port again: pod names
    await eventually(lambda: urls(pods) == {"dp": "http://10.0.0.1:9000"}, what="re-mapped")
    assert pods["dp"].events == "tcp://10.0.0.1:5557"
    assert len(kube_api.lists()) == 1  # the pods were re-mapped, not listed again


async def test_a_new_selector_is_followed(kube_api: FakeKubeAPI, start_pool: StartPool) -> None:
    make_pool(kube_api, match_labels={"app": "vllm"})
    kube_api.create(NAMESPACE, engine("gpu", "10.0.0.1", tier="gpu"))
    kube_api.create(NAMESPACE, engine("cpu", "10.0.0.2"))
    kube_api.create(NAMESPACE, engine("v2", "10.0.0.3", app="vllm-v2", tier="gpu"))
    watching = await start_pool()
    listener = watching.listener
    assert sorted(listener.pods) == ["cpu", "gpu"]

    change_pool(kube_api, spec_set(selector=selector(app="vllm", tier="gpu")))
    await eventually(lambda: sorted(listener.pods) == ["gpu"], what="cpu left")
    change_pool(kube_api, spec_set(selector=selector(tier="gpu")))
    await eventually(lambda: sorted(listener.pods) == ["gpu", "v2"], what="v2 joined")
    assert ("remove", "gpu") not in listener.calls  # selected throughout: never dropped

    def selectors() -> list[str]:  # of the pod watches, in order (renewals repeat one)
        return list(dict.fromkeys(w["labelSelector"] for w in kube_api.watches()))

    await eventually(lambda: len(selectors()) == 3, what="the third pod watch")
    assert selectors() == ["app=vllm", "app=vllm,tier=gpu", "tier=gpu"]
    await eventually(lambda: kube_api.open_watches() == 2, what="old pod watches closed")

    kube_api.create(NAMESPACE, engine("new-gpu", "10.0.0.4", app="other", tier="gpu"))
    kube_api.create(NAMESPACE, engine("new-cpu", "10.0.0.5"))  # only the old selector's
    await eventually(lambda: "new-gpu" in listener.pods, what="a newly selected pod")
    assert "new-cpu" not in listener.pods
    assert watching.errors == []


async def test_pods_join_and_leave(kube_api: FakeKubeAPI, start_pool: StartPool) -> None:
    make_pool(kube_api)
    watching = await start_pool()
    pods = watching.listener.pods
    assert pods == {}
    kube_api.create(NAMESPACE, engine("a", "10.0.0.1"))
    await eventually(lambda: "a" in pods, what="a joined")

    def unready(pod: dict[str, Any]) -> None:
        for condition in pod["status"]["conditions"]:
            condition["status"] = "False"

    kube_api.update(NAMESPACE, "a", unready)
    await eventually(lambda: not pods["a"].ready, what="a not ready")

    def relabel(pod: dict[str, Any]) -> None:
        pod["metadata"]["labels"]["app"] = "retired"

    kube_api.update(NAMESPACE, "a", relabel)  # out of the selector
    await eventually(lambda: "a" not in pods, what="a left")
    kube_api.create(NAMESPACE, engine("b", "10.0.0.2"))
    await eventually(lambda: "b" in pods, what="b joined")
    kube_api.delete(NAMESPACE, "b")
    await eventually(lambda: pods == {}, what="b deleted")


async def test_a_deleted_pool_empties_the_set_until_it_exists_again(
    kube_api: FakeKubeAPI, start_pool: StartPool
) -> None:
    watching = await start_pool()  # no pool yet: ready, with nothing to route to
    pods = watching.listener.pods
    kube_api.create(NAMESPACE, engine("a", "10.0.0.1"))
    assert pods == {}
    make_pool(kube_api)
    await eventually(lambda: "a" in pods, what="the pool created")

    kube_api.delete(NAMESPACE, POOL, resource=POOLS)
    await eventually(lambda: pods == {}, what="endpoints gone with the pool")
    await eventually(lambda: kube_api.open_watches() == 1, what="only the pool watch left")
    kube_api.create(NAMESPACE, engine("b", "10.0.0.2"))
    make_pool(kube_api, ports=(8002,))
    await eventually(lambda: sorted(pods) == ["a", "b"], what="the pool back")
    assert pods["b"].url == "http://10.0.0.2:8002"
    assert watching.errors == []


async def test_a_malformed_pool_is_ignored_and_counted(
    kube_api: FakeKubeAPI, start_pool: StartPool
) -> None:
    bad = pool_object(POOL)
    del bad["spec"]["selector"]
    kube_api.create(NAMESPACE, bad, resource=POOLS)
    kube_api.create(NAMESPACE, engine("a", "10.0.0.1"))
    watching = await start_pool()
    pods = watching.listener.pods
    assert pods == {}
    [error] = watching.errors
    assert "spec.selector.matchLabels" in str(error) and POOL in str(error)

    change_pool(kube_api, spec_set(selector=selector(app="vllm")))
    await eventually(lambda: "a" in pods, what="the fixed pool")
    for broken in (
        spec_set(targetPorts=ports(0)),
        spec_set(targetPorts=ports(8000, 8000)),
        spec_set(targetPorts="8000"),
        spec_set(selector=selector()),
        spec_set(selector={"matchLabels": {"app": ["vllm"]}}),
    ):
        change_pool(kube_api, broken)
        change_pool(kube_api, spec_set(selector=selector(app="vllm"), targetPorts=ports(8000)))
    await eventually(lambda: len(watching.errors) == 6, what="each broken version counted")
    assert urls(pods) == {"a": "http://10.0.0.1:8000"}  # the last good spec stayed
    assert ("remove", "a") not in watching.listener.calls
    assert watching.discovery.errors == 6


async def test_a_selected_pod_without_a_model_is_reported_once(
    kube_api: FakeKubeAPI, start_pool: StartPool
) -> None:
    make_pool(kube_api)
    kube_api.create(NAMESPACE, pod_object("bare", labels={"app": "vllm"}, ip="10.0.0.1"))
    watching = await start_pool()
    assert watching.listener.pods == {}
    kube_api.update(NAMESPACE, "bare", lambda pod: pod["metadata"]["labels"].update(x="1"))
    await eventually(lambda: kube_api.watches() != [], what="the pod watch")
    kube_api.update(NAMESPACE, "bare", lambda pod: pod["metadata"]["labels"].update(
        {MODEL_LABEL: MODEL}))  # fmt: skip
    await eventually(lambda: "bare" in watching.listener.pods, what="the labelled pod")
    [error] = watching.errors
    assert MODEL_LABEL in str(error) and "bare" in str(error)


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
async def test_gone_relists_the_pool_and_its_pods(
    kube_api: FakeKubeAPI, start_pool: StartPool, as_http: bool
) -> None:
    kube_api.gone_as_http = as_http
    make_pool(kube_api)
    for name, ip in (("keep", "10.0.0.1"), ("delete", "10.0.0.2")):
        kube_api.create(NAMESPACE, engine(name, ip))
    kube_api.create(NAMESPACE, engine("joins", "10.0.0.3", tier="gpu", app="v2"))
    watching = await start_pool()
    listener = watching.listener
    await eventually(lambda: kube_api.open_watches() == 2, what="two watches")
    before = len(listener.calls)

    kube_api.hold_watches = asyncio.Event()  # nothing of what follows is seen as it happens
    kube_api.drop_watches()
    kube_api.delete(NAMESPACE, "delete")
    change_pool(kube_api, spec_set(targetPorts=ports(8000, 8001)))
    change_pool(kube_api, spec_set(targetPorts=ports(8000)))
    kube_api.create(NAMESPACE, engine("new", "10.0.0.4"))
    kube_api.compact()
    kube_api.hold_watches.set()

    await eventually(lambda: "new" in listener.pods, what="the re-list")
    assert sorted(listener.pods) == ["keep", "new"]
    assert sorted(listener.calls[before:]) == [("remove", "delete"), ("upsert", "new")]
    assert len(kube_api.lists(POOLS)) == 2 and len(kube_api.lists()) == 2
    assert watching.discovery.relists == 2
    change_pool(kube_api, spec_set(selector=selector(tier="gpu")))
    await eventually(lambda: sorted(listener.pods) == ["joins"], what="watching after it")


async def test_configuration_mistakes_stop_start_up(
    kube_api: FakeKubeAPI, start_pool: StartPool
) -> None:
    kube_api.crd_installed = False
    with pytest.raises(ConfigError, match=r"KVGATE_INFERENCE_POOL.*CRD.*404"):
        await start_pool()
    kube_api.crd_installed = True
    make_pool(kube_api)
    kube_api.forbidden.add("pods")
    with pytest.raises(ConfigError, match=r"KVGATE_INFERENCE_POOL.*watch pods.*403"):
        await start_pool()


async def test_cancelling_run_stops_both_watches(
    kube_api: FakeKubeAPI, start_pool: StartPool
) -> None:
    make_pool(kube_api)
    watching = await start_pool()
    await eventually(lambda: kube_api.open_watches() == 2, what="two watches")
    change_pool(kube_api, spec_set(selector=selector(app="v2")))  # a third thread, retired
    await eventually(
        lambda: any(w["labelSelector"] == "app=v2" for w in kube_api.watches()),
        what="the new pod watch",
    )
    await watching.stop()
    await eventually(lambda: watch_threads() == [], what="the watch threads ended")
    await eventually(lambda: kube_api.open_watches() == 0, what="the watches closed")
