"""KubernetesDiscovery with the real `kubernetes` client against the fake API server:
list, watch, resourceVersions, bookmarks, 410 Gone, failures and shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.control.discovery.kubepods import HTTP_PORT, KV_EVENTS
from gateway.control.discovery.kubepods import MODEL as MODEL_LABEL
from gateway.errors import ConfigError
from tests.gateway.discovery.conftest import (
    MODEL,
    NAMESPACE,
    SELECTED,
    StartDiscovery,
    watch_threads,
)
from tests.gateway.discovery.kubeapi import FakeKubeAPI, pod_object
from tests.helpers import eventually


def engine_pod(name: str, ip: str = "10.0.0.1", **kwargs: Any) -> dict[str, Any]:
    labels = {**SELECTED, KV_EVENTS: "true", **kwargs.pop("labels", {})}
    return pod_object(name, labels=labels, ip=ip, **kwargs)


def set_ready(ready: bool) -> Any:
    def change(pod: dict[str, Any]) -> None:
        for condition in pod["status"]["conditions"]:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition["status"] = "True" if ready else "False"

    return change


def set_labels(**labels: str | None) -> Any:
    def change(pod: dict[str, Any]) -> None:
        for key, value in labels.items():
            key = {"model": MODEL_LABEL, "kv_events": KV_EVENTS}[key]
            if value is None:
                pod["metadata"]["labels"].pop(key, None)
            else:
                pod["metadata"]["labels"][key] = value

    return change


async def test_lists_selected_pods_in_pages_then_watches_from_the_list_version(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery
) -> None:
    for i in range(5):
        kube_api.create(NAMESPACE, engine_pod(f"vllm-{i}", ip=f"10.0.0.{i + 1}"))
    kube_api.create(NAMESPACE, pod_object("unrelated", labels={"app": "web"}))
    kube_api.create("elsewhere", engine_pod("vllm-other"))
    kube_api.create(NAMESPACE, engine_pod("pending", ip=None, phase="Pending", ready=False))
    listed_at = kube_api.rv

    watching = await start_discovery()

    pods = watching.listener.pods
    assert sorted(pods) == [f"vllm-{i}" for i in range(5)]
    assert all(pod.ready and pod.model == MODEL for pod in pods.values())
    assert pods["vllm-3"].url == "http://10.0.0.4:8000"
    assert pods["vllm-3"].events == "tcp://10.0.0.4:5557"
    assert pods["vllm-3"].replay == "tcp://10.0.0.4:5558"
    [listed] = kube_api.lists()
    assert listed["labelSelector"] == MODEL_LABEL and listed["limit"] == "2"
    continued = [p for kind, _, p in kube_api.requests if kind == "list pods" and "continue" in p]
    assert len(continued) == 2  # 5 pods, pages of 2
    await eventually(lambda: len(kube_api.watches()) == 1, what="a watch")
    [watch] = kube_api.watches()
    assert watch["resourceVersion"] == str(listed_at)
    assert watch["allowWatchBookmarks"] == "true" and watch["timeoutSeconds"] == "5"
    assert watching.discovery.relists == 0 and watching.errors == []


async def test_follows_a_pod_through_its_lifecycle(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery
) -> None:
    watching = await start_discovery()
    pods = watching.listener.pods
    assert pods == {}

    kube_api.create(NAMESPACE, engine_pod("p", ip=None, phase="Pending", ready=False))

    def scheduled(pod: dict[str, Any]) -> None:
        pod["status"].update(phase="Running", podIP="10.1.0.7", podIPs=[{"ip": "10.1.0.7"}])

    kube_api.update(NAMESPACE, "p", scheduled)  # running, not ready yet
    await eventually(lambda: "p" in pods, what="the pod with an IP")
    assert pods["p"].ready is False and pods["p"].url == "http://10.1.0.7:8000"

    kube_api.update(NAMESPACE, "p", set_ready(True))
    await eventually(lambda: pods["p"].ready, what="readiness")

    kube_api.update(NAMESPACE, "p", set_ready(False))
    await eventually(lambda: not pods["p"].ready, what="readiness lost")
    assert "p" in pods  # kept (not routable) while it is only not ready

    kube_api.update(NAMESPACE, "p", set_ready(True))

    def moved(pod: dict[str, Any]) -> None:
        pod["status"].update(podIP="10.1.0.8", podIPs=[{"ip": "10.1.0.8"}])

    kube_api.update(NAMESPACE, "p", moved)
    await eventually(lambda: pods["p"].url == "http://10.1.0.8:8000", what="the new IP")
    assert pods["p"].ready and pods["p"].events == "tcp://10.1.0.8:5557"

    def terminating(pod: dict[str, Any]) -> None:
        pod["metadata"]["deletionTimestamp"] = "2026-11-21T10:05:00Z"

    kube_api.update(NAMESPACE, "p", terminating)
    await eventually(lambda: "p" not in pods, what="removal when deletion starts")
    kube_api.delete(NAMESPACE, "p")
    kube_api.create(NAMESPACE, engine_pod("q"))
    await eventually(lambda: "q" in pods, what="the next pod")
    assert watching.listener.calls.count(("remove", "p")) == 1
    assert "p" not in pods


async def test_relabelling_removes_and_adds_pods_and_their_events(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery
) -> None:
    kube_api.create(NAMESPACE, engine_pod("p"))
    watching = await start_discovery()
    pods = watching.listener.pods
    assert pods["p"].events is not None

    kube_api.update(NAMESPACE, "p", set_labels(kv_events=None))
    await eventually(lambda: pods["p"].events is None, what="events opted out")
    assert pods["p"].replay is None and pods["p"].ready
    kube_api.update(NAMESPACE, "p", set_labels(kv_events="true"))
    await eventually(lambda: pods["p"].events is not None, what="events opted in")

    kube_api.update(NAMESPACE, "p", set_labels(model=None))  # leaves the selector
    await eventually(lambda: "p" not in pods, what="unlabelled pod removed")
    kube_api.update(NAMESPACE, "p", set_labels(model=MODEL))
    await eventually(lambda: "p" in pods, what="relabelled pod back")
    assert pods["p"].events == "tcp://10.0.0.1:5557"


@pytest.mark.parametrize("abrupt", [False, True], ids=["closed", "cut"])
async def test_a_dropped_watch_resumes_from_the_last_version_without_listing(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery, abrupt: bool
) -> None:
    kube_api.create(NAMESPACE, engine_pod("a"))
    watching = await start_discovery()
    pods = watching.listener.pods
    kube_api.create(NAMESPACE, engine_pod("b", ip="10.0.0.2"))
    await eventually(lambda: "b" in pods, what="b")
    seen = kube_api.rv

    kube_api.drop_watches(abrupt=abrupt)
    await eventually(lambda: len(kube_api.watches()) == 2, what="a new watch")
    assert kube_api.watches()[1]["resourceVersion"] == str(seen)
    kube_api.delete(NAMESPACE, "a")
    await eventually(lambda: "a" not in pods, what="a deleted after the resume")
    assert len(kube_api.lists()) == 1 and watching.discovery.relists == 0


async def test_a_bookmark_moves_the_version_past_changes_it_did_not_see(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery
) -> None:
    kube_api.create(NAMESPACE, engine_pod("a"))
    watching = await start_discovery()
    await eventually(lambda: kube_api.open_watches() == 1, what="a watch")
    for i in range(3):  # changes the selector hides: the watcher's version stays behind
        kube_api.create(NAMESPACE, pod_object(f"web-{i}", labels={"app": "web"}))
    kube_api.bookmark()
    bookmarked = kube_api.rv
    await eventually(
        lambda: watching.discovery.resource_versions() == {NAMESPACE: str(bookmarked)},
        what="the bookmark's version taken",
    )
    kube_api.compact()  # only history before `bookmarked` is gone
    kube_api.drop_watches()
    await eventually(lambda: len(kube_api.watches()) == 2, what="a new watch")
    assert kube_api.watches()[1]["resourceVersion"] == str(bookmarked)
    assert len(kube_api.lists()) == 1 and watching.discovery.relists == 0
    assert list(watching.listener.pods) == ["a"]


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
async def test_gone_relists_without_losing_or_duplicating_pods(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery, as_http: bool
) -> None:
    kube_api.gone_as_http = as_http
    for name in ("keep", "change", "delete"):
        kube_api.create(NAMESPACE, engine_pod(name))
    watching = await start_discovery()
    listener = watching.listener
    await eventually(lambda: kube_api.open_watches() == 1, what="a watch")
    before = len(listener.calls)

    kube_api.hold_watches = asyncio.Event()  # the watcher cannot see what happens next
    kube_api.drop_watches()
    kube_api.delete(NAMESPACE, "delete")
    kube_api.update(NAMESPACE, "change", set_ready(False))
    kube_api.create(NAMESPACE, engine_pod("new", ip="10.0.0.9"))
    kube_api.compact()
    kube_api.hold_watches.set()

    await eventually(lambda: "new" in listener.pods, what="the re-list")
    assert len(kube_api.lists()) == 2 and watching.discovery.relists == 1
    assert sorted(listener.pods) == ["change", "keep", "new"]
    assert listener.pods["change"].ready is False
    assert sorted(listener.calls[before:]) == [
        ("remove", "delete"),
        ("upsert", "change"),
        ("upsert", "new"),
    ]  # nothing re-reported for "keep"
    kube_api.create(NAMESPACE, engine_pod("after", ip="10.0.0.10"))
    await eventually(lambda: "after" in listener.pods, what="watching after the re-list")


async def test_failures_back_off_keep_the_last_view_and_recover(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery
) -> None:
    kube_api.create(NAMESPACE, engine_pod("a"))
    watching = await start_discovery()
    await eventually(lambda: kube_api.open_watches() == 1, what="a watch")
    kube_api.fail_next = 3
    kube_api.drop_watches(abrupt=True)
    await eventually(lambda: len(watching.errors) >= 4, what="the failures reported")
    assert list(watching.listener.pods) == ["a"]  # the last good view is kept
    kube_api.create(NAMESPACE, engine_pod("b", ip="10.0.0.2"))
    await eventually(lambda: "b" in watching.listener.pods, what="recovery")
    assert watching.discovery.errors == len(watching.errors)
    assert any("500" in str(error) for error in watching.errors)


async def test_a_misconfigured_pod_is_ignored_and_counted(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery
) -> None:
    kube_api.create(NAMESPACE, engine_pod("bad", annotations={HTTP_PORT: "http"}))
    watching = await start_discovery()
    assert watching.listener.pods == {}
    [error] = watching.errors
    assert "kvgate.ai/http-port" in str(error)

    def fixed(pod: dict[str, Any]) -> None:
        pod["metadata"]["annotations"][HTTP_PORT] = "8001"

    kube_api.update(NAMESPACE, "bad", fixed)
    await eventually(lambda: "bad" in watching.listener.pods, what="the fixed pod")
    assert watching.listener.pods["bad"].url == "http://10.0.0.1:8001"


async def test_several_namespaces_qualify_pod_names(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery
) -> None:
    kube_api.create("team-a", engine_pod("vllm-0"))
    kube_api.create("team-b", engine_pod("vllm-0", ip="10.0.0.2"))
    watching = await start_discovery(("team-a", "team-b"))
    assert sorted(watching.listener.pods) == ["team-a/vllm-0", "team-b/vllm-0"]
    kube_api.delete("team-b", "vllm-0")
    await eventually(lambda: list(watching.listener.pods) == ["team-a/vllm-0"], what="delete")


async def test_configuration_mistakes_stop_start_up(start_discovery: StartDiscovery) -> None:
    with pytest.raises(ConfigError, match="KVGATE_K8S_LABEL_SELECTOR"):
        await start_discovery(label_selector="model in (a")
    with pytest.raises(ConfigError, match=r"KVGATE_K8S_NAMESPACES.*401"):
        await start_discovery(token="not-the-token")


async def test_cancelling_run_stops_the_watch_threads(
    kube_api: FakeKubeAPI, start_discovery: StartDiscovery
) -> None:
    watching = await start_discovery(("a", "b"))
    await eventually(lambda: kube_api.open_watches() == 2, what="two watches")
    assert len(watch_threads()) == 2
    await watching.stop()
    await eventually(lambda: watch_threads() == [], what="the watch threads ended")
    await eventually(lambda: kube_api.open_watches() == 0, what="the watches closed")
