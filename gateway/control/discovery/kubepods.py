"""A Kubernetes Pod object (the API's JSON form) as a `Pod`: labels, annotations, readiness.

The mapping (documented in docs/kubernetes.md):
- model: label `model.aibrix.ai/name`, else the annotation of the same name;
- KV events only when the label `model.aibrix.ai/kv-events-enabled` is `"true"`;
- ports: annotation `kvgate.ai/{http,events,replay}-port`, else the container port named
  `http` / `kv-events` / `kv-replay`, else 8000 / 5557 / 5558;
- engine (`kvgate.ai/engine`, label or annotation), topic and LoRAs by annotation;
- routable (`ready`) when Running, Ready, with an IP and not being deleted.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from gateway.control.discovery.pods import ENGINES, Pod
from gateway.errors import ConfigError

MODEL = "model.aibrix.ai/name"
KV_EVENTS = "model.aibrix.ai/kv-events-enabled"
ENGINE = "kvgate.ai/engine"
HTTP_PORT = "kvgate.ai/http-port"
EVENTS_PORT = "kvgate.ai/events-port"
REPLAY_PORT = "kvgate.ai/replay-port"
TOPIC = "kvgate.ai/topic"
LORAS = "kvgate.ai/loras"

# annotation -> (container port name, default port)
_PORTS = {
    HTTP_PORT: ("http", 8000),
    EVENTS_PORT: ("kv-events", 5557),
    REPLAY_PORT: ("kv-replay", 5558),
}


def pod_key(obj: Mapping[str, Any], *, qualified: bool) -> str:
    """The name the gateway knows the pod by: `name`, or `namespace/name` when several
    namespaces are watched (names are unique only within a namespace)."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name", ""))
    return f"{metadata.get('namespace', '')}/{name}" if qualified else name


def pod_from_object(
    obj: Mapping[str, Any], *, name: str, http_port: int | None = None, rank: int = 0
) -> Pod | None:
    """The `Pod` for a Kubernetes pod object, or None when it cannot be routed to at all
    (being deleted, no IP yet, no model) and must not be reported.

    A pod that is there but not Running and Ready is reported with `ready=False`.
    `http_port` (an InferencePool's target port) replaces the pod's own HTTP port; the
    `rank`-th target port's engine publishes its KV events and replays on the pod's
    ports plus `rank`, as vLLM's data-parallel ranks do.
    Raises ConfigError (naming the pod and the label or annotation) for a bad value.
    """
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    labels: Mapping[str, str] = metadata.get("labels") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    if metadata.get("deletionTimestamp"):
        return None  # terminating: its endpoints are going away, stop at once
    ip = status.get("podIP")
    model = labels.get(MODEL) or annotations.get(MODEL)
    if not ip or not model:
        return None
    where = f"pod {name}"
    host = _host(ip, where)
    ports = {
        key: _port(annotations, key, _container_ports(obj), where) for key in _PORTS
    }  # fmt: skip
    engine = (labels.get(ENGINE) or annotations.get(ENGINE) or "vllm").lower()
    if engine not in ENGINES:
        raise ConfigError(f"{where}: {ENGINE}", engine, "vllm or sglang")
    events = replay = None
    if labels.get(KV_EVENTS) == "true":
        if max(ports[EVENTS_PORT], ports[REPLAY_PORT]) + rank > 65535:
            raise ConfigError(f"{where}: {EVENTS_PORT}", ports[EVENTS_PORT],
                              f"ports that leave room for {rank + 1} ranks")  # fmt: skip
        events = f"tcp://{host}:{ports[EVENTS_PORT] + rank}"
        replay = f"tcp://{host}:{ports[REPLAY_PORT] + rank}"
    loras = tuple(x.strip() for x in annotations.get(LORAS, "").split(",") if x.strip())
    return Pod(
        name=name,
        url=f"http://{host}:{http_port or ports[HTTP_PORT]}",
        model=model,
        engine=engine,
        events=events,
        replay=replay,
        topic=annotations.get(TOPIC, ""),
        loras=loras,
        ready=_running_and_ready(status),
    )


def _running_and_ready(status: Mapping[str, Any]) -> bool:
    if status.get("phase") != "Running":
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _host(ip: str, where: str) -> str:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        raise ConfigError(f"{where}: status.podIP", ip, "an IP address") from None
    return f"[{address}]" if address.version == 6 else str(address)


def _container_ports(obj: Mapping[str, Any]) -> dict[str, int]:
    named: dict[str, int] = {}
    for container in (obj.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") and isinstance(port.get("containerPort"), int):
                named.setdefault(port["name"], port["containerPort"])
    return named


def _port(annotations: Mapping[str, str], key: str, named: Mapping[str, int], where: str) -> int:
    port_name, default = _PORTS[key]
    raw = annotations.get(key)
    if raw is None:
        return named.get(port_name, default)
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise ConfigError(f"{where}: annotation {key}", raw, "a TCP port in 1..65535")
    return port
