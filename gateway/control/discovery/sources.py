"""The discovery sources by name (`KVGATE_DISCOVERY`), each built from the settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.control.discovery.base import Discovery, DiscoveryEvents
from gateway.control.discovery.inferencepool import InferencePoolDiscovery
from gateway.control.discovery.kubernetes import KubernetesDiscovery
from gateway.control.discovery.static import StaticFileDiscovery, load_pods_file
from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.settings import Settings


def _static(settings: Settings, events: DiscoveryEvents) -> Discovery:
    if settings.pods_file is None:
        raise ConfigError("KVGATE_PODS_FILE", None, "a pods file: pass --pods FILE")
    load_pods_file(settings.pods_file)  # a bad file stops start-up here, with its message
    return StaticFileDiscovery(settings.pods_file, events=events)


def _kubernetes(settings: Settings, events: DiscoveryEvents) -> Discovery:
    return KubernetesDiscovery.from_environment(
        settings.k8s_namespaces, settings.k8s_label_selector, events=events
    )


def _inference_pool(settings: Settings, events: DiscoveryEvents) -> Discovery:
    if settings.inference_pool is None:
        raise ConfigError(
            "KVGATE_INFERENCE_POOL", None, "the pool to take pods from: name or namespace/name"
        )
    return InferencePoolDiscovery.from_environment(settings.inference_pool, events=events)


SOURCES: dict[str, Callable[[Settings, DiscoveryEvents], Discovery]] = {
    "static": _static,
    "kubernetes": _kubernetes,
    "inference-pool": _inference_pool,
}
"""Every source `KVGATE_DISCOVERY` may name (gateway.settings.DISCOVERIES lists the same)."""


def build_discovery(settings: Settings, events: DiscoveryEvents) -> Discovery:
    """The source `KVGATE_DISCOVERY` names, reporting its failures and relists to
    `events`."""
    return SOURCES[settings.discovery](settings, events)
