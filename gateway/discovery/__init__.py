"""Where pods come from: a static file today, the Kubernetes API later."""

from gateway.discovery.base import Discovery, PodListener, sync_pods
from gateway.discovery.pods import Pod, parse_pods
from gateway.discovery.static import StaticFileDiscovery, load_pods_file

__all__ = [
    "Discovery",
    "Pod",
    "PodListener",
    "StaticFileDiscovery",
    "load_pods_file",
    "parse_pods",
    "sync_pods",
]
