"""The app factory: the gateway as an ASGI app whose lifespan owns every client and
background task (built and started by gateway/lifespan.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from gateway.control import admin
from gateway.control.discovery import (
    Discovery,
    DiscoveryFactory,
    build_discovery,
)
from gateway.control.pinning import api as pinning_api
from gateway.control.replication import CurveKeys, load_keys
from gateway.errors import GatewayError, refusal
from gateway.http import api, passthrough
from gateway.http.client_address import ForwardedClients, TrustedProxies
from gateway.http.edge import CutConnections
from gateway.http.limits import ConcurrencyLimit
from gateway.lifespan import Foundation, start_gateway
from gateway.observability.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.state import GatewayState
from indexer import SyncPrefixHashTable

logger = logging.getLogger(__name__)

Attach = Callable[[GatewayState, contextlib.AsyncExitStack], Awaitable[None]]


def create_app(
    settings: Settings,
    *,
    discovery: DiscoveryFactory | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    metrics_registry: CollectorRegistry | None = None,
    rng: random.Random | None = None,
    attach: Attach | None = None,
) -> Starlette:
    """The gateway as an ASGI app; every collaborator can be injected (tests, embedding).
    `discovery` builds the pod source from the events it reports to (default: the one
    `KVGATE_DISCOVERY` names). `attach` starts a service beside the HTTP one once the
    gateway is ready, on the lifespan's exit stack (which stops it before the gateway:
    `kvgate epp`'s gRPC server)."""
    metrics = GatewayMetrics(metrics_registry or CollectorRegistry())
    events = metrics.control.discovery_events()
    base = Foundation(
        settings=settings,
        discovery=(discovery or functools.partial(build_discovery, settings))(events),
        transport=transport,
        metrics=metrics,
        table=SyncPrefixHashTable(settings.index),
        rng=rng or random.Random(),
        keys=_replica_keys(settings),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            app.state.gateway = await start_gateway(base, stack)
            if attach is not None:
                await attach(app.state.gateway, stack)
            stack.enter_context(_reload_on_sighup(base.discovery))
            yield

    routes = [*api.routes, *passthrough.routes, *admin.routes, *pinning_api.routes]
    app = Starlette(routes=routes, lifespan=lifespan)
    # Starlette answers `/v1/embeddings/` with a 307 whose Location it builds from the
    # client's Host header; a path the gateway does not serve is a 404 instead.
    app.router.redirect_slashes = False
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(HTTPException, _http_error)
    limited: ASGIApp = ConcurrencyLimit(
        api.GenerationLane(app),
        limit=settings.max_concurrent_requests,
        bodies_per_client=settings.max_bodies_per_client,
        on_reject=metrics.http.rejected.labels("TooManyRequests").inc,
    )
    if settings.trusted_proxies:  # no proxy trusted: no layer, the peer is the client
        limited = ForwardedClients(limited, TrustedProxies(settings.trusted_proxies))
    return CutConnections(  # type: ignore[return-value]
        limited,
        app,
        access_log=settings.access_log,
        admin_port=settings.admin_port,
        on_invalid_header=lambda header: metrics.http.invalid_headers.labels(header).inc(),
    )


def _replica_keys(settings: Settings) -> CurveKeys | None:
    """Read now, so a missing or bad key file stops start-up with one line."""
    if settings.replica_sync_bind is None:
        return None
    return load_keys(settings.replica_curve_secret_key, settings.replica_curve_peer_keys,
                     settings.replica_curve_keys_dir)  # fmt: skip


@contextlib.contextmanager
def _reload_on_sighup(discovery: Discovery) -> Iterator[None]:
    """SIGHUP makes discovery look again, e.g. re-read its file (one gateway per process)."""
    loop = asyncio.get_running_loop()
    installed = False
    try:
        loop.add_signal_handler(signal.SIGHUP, discovery.request_reload)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
        logger.info("SIGHUP cannot be handled here; discovery still follows its changes")
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGHUP)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    gateway = getattr(request.app.state, "gateway", None)
    return refusal(exc, None if gateway is None else gateway.metrics.http)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    body = {"error": {"message": exc.detail, "type": "invalid_request_error", "param": None,
                      "code": exc.status_code}}  # fmt: skip
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
