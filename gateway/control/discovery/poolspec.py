"""An InferencePool (`inference.networking.k8s.io/v1`, the Gateway API Inference
Extension) as what discovery needs of it: which pods (`spec.selector.matchLabels`) and
which of their ports (`spec.targetPorts`), and how its endpoints are named."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import ConfigError

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"
MAX_TARGET_PORTS = 8  # the CRD's bound
MAX_MATCH_LABELS = 64
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")


@dataclass(frozen=True, slots=True)
class PoolRef:
    """Which pool: `KVGATE_INFERENCE_POOL` is `name` (the gateway's own namespace) or
    `namespace/name`."""

    namespace: str | None
    name: str

    @classmethod
    def parse(cls, text: str) -> PoolRef:
        namespace, _, name = text.strip().rpartition("/")
        if (namespace and not _NAMESPACE.fullmatch(namespace)) or not _NAME.fullmatch(name):
            raise ValueError(text)
        return cls(namespace or None, name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """The part of a pool's spec that decides its endpoints."""

    match_labels: tuple[tuple[str, str], ...]
    """Sorted (key, value) pairs; a pod is selected when it has every one."""
    target_ports: tuple[int, ...]
    """In the pool's order: the i-th port is data-parallel rank i (`endpoint_name`)."""

    @property
    def label_selector(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.match_labels)

    def selects(self, pod: Mapping[str, Any]) -> bool:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return all(labels.get(key) == value for key, value in self.match_labels)

    def endpoint_name(self, pod_name: str, rank: int) -> str:
        """The name the registry knows an endpoint by: the pod's name for a pool with one
        target port, else `<pod>-rank-<i>` for its i-th port."""
        return pod_name if len(self.target_ports) == 1 else f"{pod_name}-rank-{rank}"


def pool_spec(obj: Mapping[str, Any], where: str) -> PoolSpec:
    """The spec of an InferencePool object; ConfigError names the pool and the field for
    one the API server would not have accepted (the CRD's schema) or that names no pods."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: spec", spec, "an object with selector and targetPorts")
    selector = spec.get("selector")
    labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    if (
        not isinstance(labels, Mapping)
        or not 0 < len(labels) <= MAX_MATCH_LABELS
        or not all(_label(key, value) for key, value in labels.items())
    ):
        raise ConfigError(
            f"{where}: spec.selector.matchLabels", labels, "1 to 64 label key: value pairs"
        )
    ports = spec.get("targetPorts")
    items = ports if isinstance(ports, list) else []
    numbers = [p.get("number") if isinstance(p, Mapping) else None for p in items]
    if (
        not 0 < len(numbers) <= MAX_TARGET_PORTS
        or not all(type(n) is int and 0 < n < 65536 for n in numbers)
        or len(set(numbers)) != len(numbers)
    ):
        raise ConfigError(
            f"{where}: spec.targetPorts", ports, "1 to 8 distinct [{number: 1..65535}]"
        )
    return PoolSpec(tuple(sorted(labels.items())), tuple(int(n) for n in numbers))  # type: ignore[arg-type]  # checked above


def _label(key: object, value: object) -> bool:
    return (
        isinstance(key, str)
        and isinstance(value, str)
        and _LABEL_KEY.fullmatch(key) is not None
        and _LABEL_VALUE.fullmatch(value) is not None
    )
