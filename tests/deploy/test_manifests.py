"""deploy/: every kustomization renders with kubectl, every object validates against the
Kubernetes OpenAPI schemas (offline, kubernetes-validate), and the manifests agree with the
gateway: real setting names, the discovery labels and ports, probes, shutdown timing."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.commands.replica_keys import SECRET_NAME, secret_manifest
from gateway.control.discovery.kubepods import pod_from_object
from gateway.control.replication.keys import PUBLIC_FILE, SECRET_FILE
from gateway.settings import Settings
from tests.deploy.support import (
    CRD_KINDS,
    DEPLOY,
    K8S_VERSIONS,
    KUSTOMIZATIONS,
    REPO,
    duration_s,
    find,
    render,
)

# The discovery contract (docs/kubernetes.md): pod labels and named container ports.
MODEL_LABEL = "model.aibrix.ai/name"
OPT_IN_LABEL = "model.aibrix.ai/kv-events-enabled"
ENGINE_LABEL = "kvgate.ai/engine"
ENGINE_PORTS = {"http": 8000, "kv-events": 5557, "kv-replay": 5558}
# Fields of each engine's KVEventsConfig (vllm/config/kv_events.py; SGLang's
# srt/disaggregation/kv_events.py has no enable_kv_cache_events: the flag itself enables it).
KV_EVENTS_FIELDS = {
    "vllm": {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint",
             "buffer_steps", "hwm", "max_queue_size", "topic"},
    "sglang": {"publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm",
               "max_queue_size", "topic"},
}  # fmt: skip


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(name) for name in KUSTOMIZATIONS}


def pod_template(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    template: dict[str, Any] = find(objects, "Deployment", name)["spec"]["template"]
    return template


# -- rendering and schemas -------------------------------------------------------------------


def test_every_kustomization_renders(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {name: sorted(obj["kind"] for obj in objects) for name, objects in rendered.items()}
    assert kinds["base"] == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment",
         "Service", "Service", "NetworkPolicy", "PodDisruptionBudget"]
    )  # fmt: skip
    assert kinds["namespace"] == ["Namespace"]  # apart: deleting the gateway keeps it
    assert kinds["examples"] == ["Deployment", "Deployment"]
    assert kinds["examples/inference-pool"] == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service",
         "InferencePool", "HTTPRoute"]
    )  # fmt: skip
    assert kinds["observability"] == ["ConfigMap", "PrometheusRule", "ServiceMonitor"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], version: str
) -> None:
    checked = 0
    for name, objects in rendered.items():
        for obj in objects:
            if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
                continue  # no OpenAPI schema: checked by structure below
            # strict: an unknown (misspelt) field fails too
            kubernetes_validate.validate(obj, version, strict=True)
            checked += 1
        assert objects, name
    assert checked == sum(len(objects) for objects in rendered.values()) - len(CRD_KINDS)


def test_the_validator_rejects_a_broken_object(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The schema check above can fail: a misspelt field and a wrong type are caught."""
    deployment = find(rendered["base"], "Deployment", "kvgate")
    misspelt = json.loads(json.dumps(deployment))
    misspelt["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, K8S_VERSIONS[0], strict=True)
    wrong_type = json.loads(json.dumps(deployment))
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, K8S_VERSIONS[0], strict=True)


# -- base: the gateway -----------------------------------------------------------------------


def test_gateway_deployment_is_replicated_probed_and_locked_down(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    deployment = find(rendered["base"], "Deployment", "kvgate")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["serve"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "add" not in security["capabilities"]
    # The read-only root leaves /tmp and the snapshot directory as the only writable paths.
    config = find(rendered["base"], "ConfigMap", "kvgate-config")["data"]
    mounts = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert mounts == {"/tmp", config["KVGATE_SNAPSHOT_DIR"]}
    assert pod["enableServiceLinks"] is False  # no KVGATE_PORT=tcp://... from the Service


def test_shutdown_finishes_before_the_kubelet_kills_the_pod(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    config = find(rendered["base"], "ConfigMap", "kvgate-config")["data"]
    pod = pod_template(rendered["base"], "kvgate")["spec"]
    (container,) = pod["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = float(command[1])
    drain_s = duration_s(config["KVGATE_DRAIN_TIMEOUT"])
    # preStop, then SIGTERM → uvicorn drains for up to KVGATE_DRAIN_TIMEOUT, then the
    # lifespan stops subscribers and clients: all of it inside the grace period.
    assert pre_stop_s + drain_s + 5 <= pod["terminationGracePeriodSeconds"]


def _string_literals(package: Path) -> set[str]:
    literals: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.add(node.value)
    return literals


def test_config_map_holds_only_settings_the_gateway_reads(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    data = find(rendered["base"], "ConfigMap", "kvgate-config")["data"]
    known = _string_literals(REPO / "gateway") | _string_literals(REPO / "indexer")
    unknown = sorted(name for name in data if name not in known)
    assert not unknown, f"ConfigMap names the gateway never reads: {unknown}"
    assert data["KVGATE_DISCOVERY"] == "kubernetes"
    assert "KVGATE_ADMIN_TOKEN" not in data  # a secret: from the Secret reference only
    settings = Settings.load(data)  # every value is valid
    assert settings.host == "0.0.0.0"
    container = pod_template(rendered["base"], "kvgate")["spec"]["containers"][0]
    assert {"name": "http", "containerPort": settings.port, "protocol": "TCP"} in container["ports"]
    assert settings.drain_timeout_s == duration_s(data["KVGATE_DRAIN_TIMEOUT"])
    # Peer bootstrap goes through the gateway's own Service (Ready replicas only).
    service = find(rendered["base"], "Service", "kvgate")
    port = service["spec"]["ports"][0]["port"]
    expected = f"http://{service['metadata']['name']}" + ("" if port == 80 else f":{port}")
    assert settings.bootstrap_peer == expected


def test_admin_token_comes_from_an_optional_secret(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    container = pod_template(rendered["base"], "kvgate")["spec"]["containers"][0]
    (token,) = [env for env in container["env"] if env["name"] == "KVGATE_ADMIN_TOKEN"]
    assert "value" not in token
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True
    assert not any(obj["kind"] == "Secret" for objects in rendered.values() for obj in objects)


def test_role_grants_only_reading_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    role = find(rendered["base"], "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = find(rendered["base"], "RoleBinding")
    account = find(rendered["base"], "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"],
         "namespace": account["metadata"]["namespace"]}
    ]  # fmt: skip
    pod = pod_template(rendered["base"], "kvgate")["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert not any(obj["kind"].startswith("Cluster") for obj in rendered["base"])


def test_service_and_budget_select_the_gateway_pods(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    labels = pod_template(rendered["base"], "kvgate")["metadata"]["labels"]
    service = find(rendered["base"], "Service", "kvgate")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    budget = find(rendered["base"], "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    deployment = find(rendered["base"], "Deployment", "kvgate")
    assert budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    # The gateway's own pods are not engines: discovery's selector must not pick them up.
    assert MODEL_LABEL not in labels


# -- examples: engines kvgate discovers ------------------------------------------------------


def _kv_events_config(args: list[str]) -> dict[str, Any]:
    (raw,) = [arg.split("=", 1)[1] for arg in args if arg.startswith("--kv-events-config=")]
    config: dict[str, Any] = json.loads(raw)
    return config


def _port_of(endpoint: str) -> int:
    match = re.fullmatch(r"tcp://\*:(\d+)", endpoint)
    assert match, f"{endpoint}: engines must bind a wildcard tcp endpoint"
    return int(match.group(1))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_example_engine_pods_carry_the_discovery_contract(
    rendered: dict[str, list[dict[str, Any]]], engine: str
) -> None:
    (deployment,) = [
        obj
        for obj in rendered["examples"]
        if obj["spec"]["template"]["metadata"]["labels"].get(ENGINE_LABEL) == engine
    ]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[OPT_IN_LABEL] == "true"
    # Relabelling a pod (opting in/out, changing model) must not orphan it from its ReplicaSet.
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert not {MODEL_LABEL, OPT_IN_LABEL, ENGINE_LABEL} & selector.keys()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == ENGINE_PORTS
    args = container["args"]
    assert f"--served-model-name={labels[MODEL_LABEL]}" in args  # what clients send as model
    assert "--port=8000" in args
    config = _kv_events_config(args)
    assert set(config) <= KV_EVENTS_FIELDS[engine]
    assert config["publisher"] == "zmq"
    assert config.get("enable_kv_cache_events", True) is True
    assert _port_of(config["endpoint"]) == ports["kv-events"]
    assert _port_of(config["replay_endpoint"]) == ports["kv-replay"]
    # Probes use the named port the gateway also talks to.
    assert container["readinessProbe"]["httpGet"]["port"] == "http"


# -- observability ---------------------------------------------------------------------------


def test_service_monitor_selects_the_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """ServiceMonitor is a CRD (no Kubernetes OpenAPI schema), so it is checked here by
    structure: it selects the gateway Service and scrapes its named port's /metrics."""
    monitor = find(rendered["observability"], "ServiceMonitor", "kvgate")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = find(rendered["base"], "Service", "kvgate")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # kvgate's own `pod` label (the engine) must survive: the target's is dropped.
    assert {"action": "labeldrop", "regex": "pod"} in endpoint["relabelings"]


def test_prometheus_rule_is_in_the_gateways_namespace(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """PrometheusRule is a CRD too: its groups are checked by promtool (test_alerts.py),
    its placement here."""
    rule = find(rendered["observability"], "PrometheusRule", "kvgate")
    service = find(rendered["base"], "Service", "kvgate")
    assert rule["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert rule["spec"]["groups"][0]["rules"]


def test_scrape_config_keeps_the_gateway_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The annotation-based scrape config keeps exactly what the gateway Deployment exposes
    (Debian's promtool is built without kubernetes_sd, so the config is checked here)."""
    config = yaml.safe_load((DEPLOY / "observability" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    template = pod_template(rendered["base"], "kvgate")
    container = template["spec"]["containers"][0]
    meta = {
        "__meta_kubernetes_namespace": template["metadata"].get("namespace", "kvgate"),
        "__meta_kubernetes_pod_container_port_name": container["ports"][0]["name"],
    }
    for key, value in template["metadata"]["labels"].items():
        meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    for key, value in template["metadata"]["annotations"].items():
        meta["__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    kept = 0
    for rule in job["relabel_configs"]:
        if rule.get("action") != "keep":
            continue
        value = ";".join(meta.get(label, "") for label in rule["source_labels"])
        assert re.fullmatch(rule["regex"], value), f"{rule} drops the gateway pods"
        kept += 1
    assert kept >= 2
    assert job["kubernetes_sd_configs"][0]["namespaces"]["names"] == [
        find(rendered["namespace"], "Namespace")["metadata"]["name"]
    ]
    targets = {rule.get("target_label") for rule in job["relabel_configs"]}
    assert "pod" not in targets  # kvgate's metrics have their own `pod` label


def test_dashboard_config_map_carries_the_dashboard(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    config_map = find(rendered["observability"], "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((DEPLOY / "observability" / "grafana-dashboard.json").read_text())
    assert json.loads(config_map["data"]["kvgate.json"]) == shipped


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_gateway_discovery_reads_the_example_pods(
    rendered: dict[str, list[dict[str, Any]]], engine: str
) -> None:
    """A running pod of each example Deployment, as the API would return it, read by the
    gateway's own Kubernetes discovery: routable, subscribed on the ports the engine binds."""
    (deployment,) = [
        obj
        for obj in rendered["examples"]
        if obj["spec"]["template"]["metadata"]["labels"].get(ENGINE_LABEL) == engine
    ]
    template = deployment["spec"]["template"]
    running = {
        "metadata": {**template["metadata"], "name": f"{engine}-0", "namespace": "kvgate"},
        "spec": template["spec"],
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    pod = pod_from_object(running, name=f"{engine}-0")
    assert pod is not None
    assert pod.ready and pod.engine == engine
    assert pod.model == template["metadata"]["labels"][MODEL_LABEL]
    assert pod.url == "http://10.1.2.3:8000"
    assert (pod.events, pod.replay) == ("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558")
    # The docs' walk-through: opting the pod out keeps it routed, without a subscriber.
    opted_out = json.loads(json.dumps(running))
    opted_out["metadata"]["labels"][OPT_IN_LABEL] = "false"
    pod = pod_from_object(opted_out, name=f"{engine}-0")
    assert pod is not None and pod.ready and pod.events is None


def test_replicas_find_each_other_and_only_they_reach_the_sync_port(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["base"]
    config = find(objects, "ConfigMap", "kvgate-config")["data"]
    sync = find(objects, "Service", "kvgate-sync")["spec"]
    host, _, port = config["KVGATE_REPLICA_PEER_SERVICE"].partition(":")
    assert host == "kvgate-sync" and sync["clusterIP"] == "None"
    assert sync["publishNotReadyAddresses"] is True
    assert [p["port"] for p in sync["ports"]] == [int(port)]
    assert config["KVGATE_REPLICA_SYNC_BIND"].endswith(f":{port}")
    container = pod_template(objects, "kvgate")["spec"]["containers"][0]
    assert {"name": "sync", "containerPort": int(port), "protocol": "TCP"} in container["ports"]
    policy = find(objects, "NetworkPolicy", "kvgate")["spec"]
    to_sync = next(rule for rule in policy["ingress"] if rule["ports"][0]["port"] == "sync")
    assert to_sync["from"] == [{"podSelector": {"matchLabels": sync["selector"]}}]


def test_replica_keys_come_from_a_required_secret_the_key_command_makes(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Bound on 0.0.0.0, the sync channel needs keys: the ConfigMap points the gateway at a
    directory where the Secret `kvgate replica-keys --kubernetes` prints is mounted, and the
    pods do not start without it."""
    objects = rendered["base"]
    config = find(objects, "ConfigMap", "kvgate-config")["data"]
    assert "KVGATE_REPLICA_CURVE_SECRET_KEY" not in config  # a secret: never in a ConfigMap
    pod = pod_template(objects, "kvgate")["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "replica-keys"]
    assert mount["mountPath"] == config["KVGATE_REPLICA_CURVE_KEYS_DIR"] and mount["readOnly"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "replica-keys"]
    made = yaml.safe_load(secret_manifest("s" * 40, "p" * 40, name=SECRET_NAME, namespace="kvgate"))
    assert volume["secret"]["secretName"] == made["metadata"]["name"] == SECRET_NAME
    assert volume["secret"]["optional"] is False
    assert set(made["stringData"]) == {SECRET_FILE, PUBLIC_FILE}
