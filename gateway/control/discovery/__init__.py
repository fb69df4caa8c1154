"""Where pods come from: a static file, or the Kubernetes API (labelled pods, or an
InferencePool's)."""

from gateway.control.discovery.base import (
    Discovery,
    DiscoveryEvents,
    DiscoveryFactory,
    PodListener,
    run_resynced,
    sync_pods,
)
from gateway.control.discovery.inferencepool import InferencePoolDiscovery
from gateway.control.discovery.kubernetes import KubernetesDiscovery
from gateway.control.discovery.pods import Pod, parse_pods
from gateway.control.discovery.sources import build_discovery
from gateway.control.discovery.static import StaticFileDiscovery, load_pods_file

__all__ = [
    "Discovery",
    "DiscoveryEvents",
    "DiscoveryFactory",
    "InferencePoolDiscovery",
    "KubernetesDiscovery",
    "Pod",
    "PodListener",
    "StaticFileDiscovery",
    "build_discovery",
    "load_pods_file",
    "parse_pods",
    "run_resynced",
    "sync_pods",
]
