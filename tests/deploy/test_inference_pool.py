"""deploy/examples/inference-pool: kvgate as an InferencePool's endpoint picker. Its custom
resources (InferencePool, HTTPRoute) validate against the vendored CRDs' schemas (offline,
tests/deploy/crds/), the validator catches broken ones, and the objects agree with each
other and with the gateway: the pool names the picker's Service and port, the picker reads
that pool with the RBAC it has, and the pool selects the example vLLM pods."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gateway.control.discovery.kubepods import pod_from_object
from gateway.control.discovery.poolspec import GROUP, PLURAL, pool_spec
from gateway.settings import Settings
from tests.deploy.crd_schema import load_crds, validate
from tests.deploy.support import CRD_KINDS, REPO, find, render
from tests.deploy.test_manifests import _string_literals

EXAMPLE = "examples/inference-pool"
Objects = list[dict[str, Any]]


@pytest.fixture(scope="module")
def objects() -> Objects:
    return render(EXAMPLE)


@pytest.fixture(scope="module")
def schemas() -> dict[tuple[str, str], dict[str, Any]]:
    return load_crds()


def test_the_custom_resources_validate_against_the_vendored_crds(
    objects: Objects, schemas: dict[tuple[str, str], dict[str, Any]]
) -> None:
    custom = [obj for obj in objects if (obj["apiVersion"], obj["kind"]) in CRD_KINDS]
    assert sorted(obj["kind"] for obj in custom) == ["HTTPRoute", "InferencePool"]
    for obj in custom:
        assert validate(obj, schemas) == [], obj["kind"]
    assert ("inference.networking.k8s.io/v1", "InferencePool") in schemas
    assert ("gateway.networking.k8s.io/v1", "HTTPRoute") in schemas


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for part in parents:
            obj = obj[int(part)] if isinstance(obj, list) else obj[part]  # type: ignore[call-overload]
        if value is _DELETE:
            del obj[last]
        else:
            obj[last] = value

    return change


_DELETE = object()


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (_set("spec.selector", _DELETE), "missing required field 'selector'"),
        (_set("spec.selector.matchLabels", {}), "fewer than 1 entries"),
        (_set("spec.targetPorts", [{"number": 70000}]), "70000 is above 65535"),
        (_set("spec.targetPorts", [{"number": 0}]), "0 is below 1"),
        (_set("spec.targetPorts", []), "fewer than 1 items"),
        (_set("spec.targetPorts", [{"number": 8000 + i} for i in range(9)]), "more than 8"),
        (_set("spec.targetPorts", [{"number": "8000"}]), "expected integer"),
        (_set("spec.endpointPickerRef.failureMode", "FailSafe"), "is not one of"),
        (_set("spec.endpointPickerRef.name", _DELETE), "missing required field 'name'"),
        (_set("spec.targetPort", 8000), "unknown field 'targetPort'"),
        (_set("spec.appProtocol", "grpc"), "is not one of"),
        (_set("spec.selector.matchLabels", {"app": "no spaces"}), "does not match"),
    ],
)
def test_the_validator_rejects_a_broken_pool(
    objects: Objects,
    schemas: dict[tuple[str, str], dict[str, Any]],
    change: Callable[[dict[str, Any]], None],
    error: str,
) -> None:
    pool = copy.deepcopy(find(objects, "InferencePool"))
    change(pool)
    found = validate(pool, schemas)
    assert any(error in line for line in found), found


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (_set("spec.rules.0.backendRefs.0.kind", "Inference Pool"), "does not match"),
        (_set("spec.rules.0.matches.0.path.type", "Prefix"), "is not one of"),
        (_set("spec.rules.0.backendRef", {}), "unknown field 'backendRef'"),
    ],
)
def test_the_validator_rejects_a_broken_route(
    objects: Objects,
    schemas: dict[tuple[str, str], dict[str, Any]],
    change: Callable[[dict[str, Any]], None],
    error: str,
) -> None:
    route = copy.deepcopy(find(objects, "HTTPRoute"))
    change(route)
    found = validate(route, schemas)
    assert any(error in line for line in found), found
    other = copy.deepcopy(route)
    other["apiVersion"] = "gateway.networking.k8s.io/v9"
    assert validate(other, schemas) == [
        "no vendored CRD serves gateway.networking.k8s.io/v9 HTTPRoute"
    ]


def test_the_pool_names_the_picker_and_the_route_the_pool(objects: Objects) -> None:
    pool = find(objects, "InferencePool")
    service = find(objects, "Service", "kvgate-epp")
    deployment = find(objects, "Deployment", "kvgate-epp")
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    picker = pool["spec"]["endpointPickerRef"]
    assert picker["failureMode"] == "FailClose"
    assert picker.get("kind", "Service") == "Service" and picker["name"] == "kvgate-epp"
    (grpc,) = [p for p in service["spec"]["ports"] if p["port"] == picker["port"]["number"]]
    assert grpc["appProtocol"] == "http2"
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    grpc_port = container_ports[grpc["targetPort"]]
    args = container["args"]
    assert args[0] == "epp" and args[args.index("--grpc-port") + 1] == str(grpc_port)
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (route,) = [o for o in objects if o["kind"] == "HTTPRoute"]
    [backend] = [ref for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    assert backend == {"group": GROUP, "kind": "InferencePool", "name": pool["metadata"]["name"]}
    assert route["metadata"]["namespace"] == pool["metadata"]["namespace"]


def test_the_picker_reads_its_pool_with_the_rights_it_has(objects: Objects) -> None:
    pool = find(objects, "InferencePool")
    config = find(objects, "ConfigMap", "kvgate-epp-config")["data"]
    known = _string_literals(REPO / "gateway") | _string_literals(REPO / "indexer")
    assert sorted(name for name in config if name not in known) == []
    settings = Settings.load(config)
    assert settings.discovery == "inference-pool"
    assert settings.inference_pool == pool["metadata"]["name"]  # in the picker's namespace
    deployment = find(objects, "Deployment", "kvgate-epp")
    assert deployment["metadata"]["namespace"] == pool["metadata"]["namespace"]
    http = {p["name"]: p["containerPort"] for p in
            deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}["http"]  # fmt: skip
    assert settings.port == http and settings.host == "0.0.0.0"
    role = find(objects, "Role")
    assert role["rules"] == [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    binding = find(objects, "RoleBinding")
    account = find(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]  # fmt: skip
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    )
    assert not any(obj["kind"].startswith("Cluster") for obj in objects)


def test_the_pool_selects_the_example_vllm_pods_and_not_the_picker(objects: Objects) -> None:
    """A running pod of the example vLLM Deployment, as the API returns it, through the
    pool's spec as the gateway reads it: selected, routed on the target port, subscribed."""
    pool = find(objects, "InferencePool")
    spec = pool_spec(pool, "example pool")
    (vllm,) = [o for o in render("examples") if o["metadata"]["name"] == "vllm-qwen2-5-1-5b"]
    template = vllm["spec"]["template"]
    running = {
        "metadata": {**template["metadata"], "name": "vllm-0", "namespace": "kvgate"},
        "spec": template["spec"],
        "status": {"phase": "Running", "podIP": "10.1.2.3",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    assert spec.selects(running)
    (container,) = template["spec"]["containers"]
    http = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert spec.target_ports == (http,)
    pod = pod_from_object(running, name="vllm-0", http_port=spec.target_ports[0])
    assert pod is not None and pod.ready
    assert pod.url == "http://10.1.2.3:8000" and pod.events == "tcp://10.1.2.3:5557"
    picker = find(objects, "Deployment", "kvgate-epp")["spec"]["template"]
    assert not spec.selects(picker)
