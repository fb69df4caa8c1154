"""Everything the request handlers share, built by the app factory and its lifespan."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.requests import Request

from gateway.control.discovery import Discovery
from gateway.control.pinning.manager import PinManager
from gateway.control.registry import PodRegistry
from gateway.control.replication import ReplicaSync
from gateway.control.supervisor import Supervisor
from gateway.observability.metrics import GatewayMetrics
from gateway.routing.router import Router
from gateway.settings import Settings
from gateway.upstream.model_catalog import ModelCatalog
from gateway.upstream.proxy import Upstream
from indexer import SyncPrefixHashTable
from subscriber import SubscriberManager


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Built once every component is (gateway/lifespan.py), never changed afterwards."""

    settings: Settings
    table: SyncPrefixHashTable
    metrics: GatewayMetrics
    registry: PodRegistry
    router: Router
    upstream: Upstream
    subscribers: SubscriberManager | None
    started_at: int
    discovery: Discovery
    pins: PinManager
    replica_sync: ReplicaSync | None
    models: ModelCatalog
    """The engines' own model cards (`GET /v1/models`)."""
    background: Supervisor
    """The supervised background tasks (which are down, waiting for their restart)."""
    discovery_ready: asyncio.Event = field(default_factory=asyncio.Event)


def state_of(request: Request) -> GatewayState:
    gateway: GatewayState = request.app.state.gateway
    return gateway
