"""Pod objects → `Pod` (labels, annotations, named ports, readiness), namespaces and the
discovery settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.control.discovery import Pod
from gateway.control.discovery.kubepods import (
    ENGINE,
    EVENTS_PORT,
    HTTP_PORT,
    KV_EVENTS,
    LORAS,
    MODEL,
    REPLAY_PORT,
    TOPIC,
    pod_from_object,
    pod_key,
)
from gateway.control.discovery.kubernetes import resolve_namespaces
from gateway.errors import ConfigError
from gateway.settings import Settings
from tests.gateway.discovery.kubeapi import pod_object


def make(**kwargs: Any) -> dict[str, Any]:
    labels = kwargs.pop("labels", {MODEL: "llama"})
    obj = pod_object("vllm-0", labels=labels, **kwargs)
    obj["metadata"]["namespace"] = "inference"
    return obj


def test_defaults_a_plain_labelled_pod() -> None:
    assert pod_from_object(make(ports={}), name="vllm-0") == Pod(
        name="vllm-0", url="http://10.0.0.1:8000", model="llama", engine="vllm", ready=True
    )


def test_every_label_and_annotation() -> None:
    obj = make(
        labels={MODEL: "llama", KV_EVENTS: "true", ENGINE: "SGLang"},
        annotations={
            HTTP_PORT: "30000",
            EVENTS_PORT: "6000",
            REPLAY_PORT: "6001",
            TOPIC: "kv@vllm-0",
            LORAS: "sql, chat,,",
        },
    )
    assert pod_from_object(obj, name="vllm-0") == Pod(
        name="vllm-0",
        url="http://10.0.0.1:30000",
        model="llama",
        engine="sglang",
        events="tcp://10.0.0.1:6000",
        replay="tcp://10.0.0.1:6001",
        topic="kv@vllm-0",
        loras=("sql", "chat"),
    )


def test_named_container_ports_then_annotations_win() -> None:
    ports = {"http": 8080, "kv-events": 7557, "kv-replay": 7558, "metrics": 9000}
    obj = make(labels={MODEL: "m", KV_EVENTS: "true"}, ports=ports, ip="fd00::7")
    pod = pod_from_object(obj, name="p")
    assert pod is not None
    assert (pod.url, pod.events, pod.replay) == (
        "http://[fd00::7]:8080",
        "tcp://[fd00::7]:7557",
        "tcp://[fd00::7]:7558",
    )
    obj["metadata"]["annotations"][HTTP_PORT] = "8001"
    assert pod_from_object(obj, name="p").url == "http://[fd00::7]:8001"  # type: ignore[union-attr]


def test_model_from_the_annotation_and_events_only_when_exactly_true() -> None:
    obj = make(labels={"app": "x", KV_EVENTS: "True"}, annotations={MODEL: "from-annotation"})
    pod = pod_from_object(obj, name="p")
    assert pod is not None and pod.model == "from-annotation" and pod.events is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"phase": "Pending"}, False),
        ({"phase": "Succeeded"}, False),
        ({"ready": False}, False),
        ({}, True),
    ],
)
def test_ready_only_when_running_and_ready(change: dict[str, Any], expected: bool) -> None:
    pod = pod_from_object(make(**change), name="p")
    assert pod is not None and pod.ready is expected


def test_not_reported_without_ip_or_model_or_when_terminating() -> None:
    assert pod_from_object(make(ip=None, phase="Pending"), name="p") is None
    assert pod_from_object(make(labels={"app": "x"}), name="p") is None
    terminating = make()
    terminating["metadata"]["deletionTimestamp"] = "2026-11-21T10:05:00Z"
    assert pod_from_object(terminating, name="p") is None


@pytest.mark.parametrize(
    ("labels", "annotations", "names"),
    [
        ({}, {HTTP_PORT: "eighty"}, HTTP_PORT),
        ({}, {EVENTS_PORT: "70000"}, EVENTS_PORT),
        ({ENGINE: "tgi"}, {}, ENGINE),
    ],
)
def test_bad_values_name_the_pod_and_the_key(
    labels: dict[str, str], annotations: dict[str, str], names: str
) -> None:
    obj = make(labels={MODEL: "m", **labels}, annotations=annotations)
    with pytest.raises(ConfigError, match=f"pod inference/vllm-0: .*{names}"):
        pod_from_object(obj, name="inference/vllm-0")


def test_pod_keys() -> None:
    assert pod_key(make(), qualified=False) == "vllm-0"
    assert pod_key(make(), qualified=True) == "inference/vllm-0"


def test_namespaces_default_to_the_gateways_own(tmp_path: Path) -> None:
    own = tmp_path / "namespace"
    assert resolve_namespaces(["a", "b", "a"], own_namespace_file=own) == ["a", "b"]
    assert resolve_namespaces([], own_namespace_file=own) == ["default"]
    own.write_text("kvgate-system\n")
    assert resolve_namespaces([], own_namespace_file=own) == ["kvgate-system"]


def test_discovery_settings() -> None:
    default = Settings.load({})
    assert (default.discovery, default.k8s_namespaces) == ("static", ())
    assert default.k8s_label_selector == "model.aibrix.ai/name"
    settings = Settings.load(
        {
            "KVGATE_DISCOVERY": "kubernetes",
            "KVGATE_K8S_NAMESPACES": " team-a, team-b ",
            "KVGATE_K8S_LABEL_SELECTOR": "model.aibrix.ai/name,tier=gpu",
        }
    )
    assert settings.discovery == "kubernetes"
    assert settings.k8s_namespaces == ("team-a", "team-b")
    assert settings.k8s_label_selector == "model.aibrix.ai/name,tier=gpu"
    with pytest.raises(ConfigError, match="KVGATE_DISCOVERY='consul'"):
        Settings.load({"KVGATE_DISCOVERY": "consul"})
    with pytest.raises(ConfigError, match="KVGATE_K8S_NAMESPACES='Team_A'"):
        Settings.load({"KVGATE_K8S_NAMESPACES": "Team_A"})
    with pytest.raises(ConfigError, match="KVGATE_DISCOVERY"):
        Settings.load({}, {"discovery": "dns"})


def test_a_target_port_and_a_rank_move_the_http_and_event_ports() -> None:
    obj = make(labels={MODEL: "m", KV_EVENTS: "true"})
    pod = pod_from_object(obj, name="p-rank-2", http_port=9002, rank=2)
    assert pod is not None
    assert (pod.url, pod.events, pod.replay) == (
        "http://10.0.0.1:9002",
        "tcp://10.0.0.1:5559",
        "tcp://10.0.0.1:5560",
    )
    obj["metadata"]["annotations"][REPLAY_PORT] = "65535"
    with pytest.raises(ConfigError, match="room for 2 ranks"):
        pod_from_object(obj, name="p-rank-1", http_port=9001, rank=1)
