"""The app factory and its lifespan, which owns every client and background task.

Start-up: HTTP clients, index snapshots (files, a peer), subscriber manager, discovery
(its first load must succeed), the metrics scraper, the index eviction timer and the
snapshot writer. Shutdown (after uvicorn has stopped accepting and drained connections):
stop discovery, scraper, eviction and writer, write a final snapshot, stop every
subscriber, close the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.control import admin
from gateway.control.discovery import Discovery, DiscoveryEvents, build_discovery, run_resynced
from gateway.control.persistence import (
    BootstrapMetrics,
    SnapshotRestorer,
    cost_model_from_peer,
    restore_snapshots,
    snapshot_writer,
)
from gateway.control.pinning import api as pinning_api
from gateway.control.pinning.client import PinClient
from gateway.control.pinning.manager import PinConfig, PinManager
from gateway.control.reaper import DeadPodReaper
from gateway.control.registry import PodRegistry
from gateway.control.replication import (
    CurveKeys,
    RegistryFleet,
    ReplicaSync,
    ReplicaSyncCollector,
    load_keys,
)
from gateway.control.supervisor import Supervisor
from gateway.errors import GatewayError, NotFound, clip, refusal
from gateway.http import api, passthrough
from gateway.http.client_address import ForwardedClients, TrustedProxies
from gateway.http.limits import ConcurrencyLimit
from gateway.http.request_id import RequestIds
from gateway.observability.metrics import GatewayMetrics
from gateway.routing import CostModel, PinLookup
from gateway.routing.router import Router, build_policies
from gateway.settings import Settings
from gateway.state import GatewayState
from gateway.upstream.http1 import Http1Pool
from gateway.upstream.local_tokenizer import LocalTokenizers
from gateway.upstream.model_catalog import ModelCatalog
from gateway.upstream.prompt_tokenizer import PromptTokenizer
from gateway.upstream.proxy import ClientGone, Upstream, UpstreamCut
from gateway.upstream.scraper import MetricsScraper
from gateway.upstream.tokenizer import RemoteTokenizer
from indexer import SyncPrefixHashTable
from subscriber import IndexSink, SubscriberManager

logger = logging.getLogger(__name__)

DISCOVERY_START_TIMEOUT_S = 30.0


def create_app(
    settings: Settings,
    *,
    discovery: Discovery | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    metrics_registry: CollectorRegistry | None = None,
    rng: random.Random | None = None,
) -> Starlette:
    """The gateway as an ASGI app; every collaborator can be injected (tests, embedding)."""
    if discovery is None:
        discovery = build_discovery(settings)
    metrics = GatewayMetrics(metrics_registry or CollectorRegistry())
    discovery_errors = metrics.discovery_errors
    discovery.events = DiscoveryEvents(
        error=lambda _error: discovery_errors.inc(), relist=metrics.discovery_relists.inc
    )
    table = SyncPrefixHashTable(settings.index)
    rng = rng or random.Random()
    # Read now, so a missing or bad key file stops start-up with one line.
    keys = (
        load_keys(settings.replica_curve_secret_key, settings.replica_curve_peer_keys,
                  settings.replica_curve_keys_dir)
        if settings.replica_sync_bind is not None
        else None
    )  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            gateway = await _start(
                app, stack, settings, discovery, transport, metrics, table, rng, keys
            )
            app.state.gateway = gateway
            stack.enter_context(_reload_on_sighup(discovery))
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
        on_reject=metrics.rejected.labels("TooManyRequests").inc,
    )
    if settings.trusted_proxies:  # no proxy trusted: no layer, the peer is the client
        limited = ForwardedClients(limited, TrustedProxies(settings.trusted_proxies))
    return _CutConnections(  # type: ignore[return-value]
        limited,
        app,
        access_log=settings.access_log,
        admin_port=settings.admin_port,
        on_invalid_header=lambda header: metrics.invalid_headers.labels(header).inc(),
    )


def _prompt_tokenizer(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    pool: Http1Pool,
    models: ModelCatalog,
) -> PromptTokenizer:
    """Where prompts are tokenized (`KVGATE_TOKENIZER`): in-process with each model's files
    where found, at the engines otherwise."""
    remote = RemoteTokenizer(
        pool,
        timeout_s=settings.tokenizer_timeout_s,
        max_retries=settings.tokenizer_max_retries,
        cache_size=settings.tokenizer_cache_size,
        endpoint=settings.tokenizer_endpoint,
        endpoint_engine=settings.tokenizer_engine,
    )
    # Loading tokenizer files and encoding long prompts: off the event loop, two at a time
    # (the library releases the GIL while it encodes).
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvgate-tokenize")
    stack.callback(executor.shutdown, wait=False, cancel_futures=True)
    hub_cache = settings.hf_hub_cache or Path.home() / ".cache" / "huggingface" / "hub"
    local = LocalTokenizers(
        directories=settings.tokenizers,
        hub_cache=hub_cache if settings.tokenizer != "remote" else None,
        executor=executor,
        cache_size=settings.tokenizer_cache_size,
    )
    return PromptTokenizer(
        mode=settings.tokenizer, local=local, remote=remote, context_length=models.max_model_len
    )


async def _start(
    app: Starlette,
    stack: contextlib.AsyncExitStack,
    settings: Settings,
    discovery: Discovery,
    transport: httpx.AsyncBaseTransport | None,
    metrics: GatewayMetrics,
    table: SyncPrefixHashTable,
    rng: random.Random,
    keys: CurveKeys | None,
) -> GatewayState:
    pool = Http1Pool(
        connect_timeout_s=settings.upstream_connect_timeout_s,
        read_timeout_s=settings.upstream_timeout_s,
        max_idle_per_origin=settings.max_connections_per_pod,
    )
    stack.push_async_callback(pool.aclose)
    tokenizer_pool = Http1Pool(
        connect_timeout_s=min(settings.upstream_connect_timeout_s, settings.tokenizer_timeout_s),
        read_timeout_s=settings.tokenizer_timeout_s,
    )
    stack.push_async_callback(tokenizer_pool.aclose)
    control_client = await stack.enter_async_context(
        httpx.AsyncClient(transport=transport, timeout=5.0)
    )
    cost = CostModel(
        settings.cost_params(),
        pure_python=settings.index.pure_python,
    )
    bootstrap_metrics = BootstrapMetrics(metrics.prometheus)
    if settings.bootstrap_peer is not None:  # the fresher view: before any file's
        await cost_model_from_peer(
            control_client, settings.bootstrap_peer, settings.admin_token, cost, bootstrap_metrics
        )
    subscribers: SubscriberManager | None = None
    restorer: SnapshotRestorer | None = None
    if settings.kv_event_sync:
        # Before discovery starts any subscriber: each starts from its pod's snapshot.
        restorer = await restore_snapshots(
            settings, table, metrics.prometheus, control_client, cost
        )
        subscribers = await stack.enter_async_context(
            SubscriberManager(IndexSink(table), resume=restorer.resume)
        )
    registry = PodRegistry(
        table=table,
        subscribers=subscribers,
        on_pod=lambda pod: metrics.known_pod(pod, settings.default_policy),
        chat_tokenizer=settings.use_remote_tokenizer
        and (
            settings.tokenizer != "remote"
            or (settings.tokenizer_endpoint is not None and settings.tokenizer_engine == "vllm")
        ),
    )
    writer = snapshot_writer(settings, table, subscribers, registry, restorer, cost)
    if writer is not None:
        stack.push_async_callback(writer.close)  # the final snapshot, after background tasks
    models = ModelCatalog(registry, control_client,
                          interval_s=max(settings.scrape_interval_s, 10.0))  # fmt: skip
    tokenizer = (
        _prompt_tokenizer(settings, stack, tokenizer_pool, models)
        if settings.use_remote_tokenizer
        else None
    )
    pin_lookup = PinLookup()
    router = Router(
        registry=registry,
        table=table,
        tokenizer=tokenizer,
        policies=build_policies(
            settings, rng, cost=cost, pins=pin_lookup, timer=metrics.time_plugin
        ),
        default_policy=settings.default_policy,
        metrics=metrics,
        cost=cost,
        pins=pin_lookup,
        max_prompt_tokens=settings.max_prompt_tokens,
        log_predictions=settings.prediction_log,
    )
    metrics.watch_fleet(registry, table, lambda: subscribers.rejects if subscribers else None, cost)
    sync = None
    if settings.replica_sync_bind is not None:
        sync = ReplicaSync(
            bind=settings.replica_sync_bind,
            peers=settings.replica_peers,
            table=table,
            cost=cost,
            fleet=RegistryFleet(registry, models, settings.max_prompt_tokens),
            keys=keys,
            peer_service=settings.replica_peer_service,
        )
        sync.start()
        stack.callback(sync.close)
        router.sync = sync
    metrics.prometheus.register(ReplicaSyncCollector(lambda: sync))
    gateway = GatewayState(
        settings=settings,
        table=table,
        metrics=metrics,
        registry=registry,
        router=router,
        upstream=Upstream(pool, metrics, pulse=cost.pulse),
        subscribers=subscribers,
        started_at=int(time.time()),
        discovery=discovery,
        replica_sync=sync,
    )
    gateway.pins = pins = PinManager(
        table=table,
        registry=registry,
        client=PinClient(control_client),
        metrics=metrics,
        config=PinConfig(
            budget_fraction=settings.pin_budget_fraction,
            default_ttl_s=settings.pin_default_ttl_s,
            max_ttl_s=settings.pin_max_ttl_s,
            max_leases=settings.pin_max_leases,
            max_leases_per_pod=settings.pin_max_leases_per_pod,
            interval_s=settings.pin_interval_s,
        ),
    )
    pin_lookup.affinity = pins.affinity
    stack.push_async_callback(pins.close)  # unpin all: after the tasks stop, before the client
    scraper = MetricsScraper(
        registry,
        control_client,
        interval_s=settings.scrape_interval_s,
        unhealthy_after=settings.unhealthy_after,
        failures=metrics.scrape_failures,
        on_scrape=lambda state, ok: (
            cost.note_scrape(state.name, state.scraped_at)
            if ok and state.scraped_at is not None
            else None
        ),
    )
    background = gateway.background = Supervisor(metrics.background_restarts)
    stack.push_async_callback(background.stop)
    discovery_task = background.start(
        "discovery",
        lambda: run_resynced(
            discovery, registry, lambda: [s.name for s in registry.all()], gateway.discovery_ready
        ),
        restart_if=gateway.discovery_ready.is_set,  # a first load that fails stops start-up
    )
    await _wait_for_discovery(gateway.discovery_ready, discovery_task)
    background.start("metrics-scraper", scraper.run)
    if tokenizer is not None:
        background.start("tokenizer-load", lambda: tokenizer.preload(registry.models))
    background.start("index-eviction", lambda: _evict_periodically(table, settings))
    reaper = DeadPodReaper(registry, gateway.upstream, metrics.dead_pod_cuts,
                           grace_s=settings.dead_pod_grace_s)  # fmt: skip
    background.start("dead-pod-reaper", reaper.run)
    background.start("pin-reconcile", pins.run)
    gateway.models = models
    background.start("model-catalog", models.run)
    if sync is not None:
        background.start("replica-sync", sync.run)
    if writer is not None:
        background.start("snapshot-writer", writer.run)
    logger.info("kvgate gateway ready: %d pods", len(registry.all()))
    return gateway


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


async def _wait_for_discovery(ready: asyncio.Event, task: asyncio.Task[None]) -> None:
    """Start-up fails, with discovery's own error, if its first load does."""
    waiter = asyncio.ensure_future(ready.wait())
    try:
        done, _ = await asyncio.wait(
            {waiter, task}, timeout=DISCOVERY_START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiter.cancel()
    if task in done:
        task.result()  # raises the discovery's error
        raise RuntimeError("discovery stopped before reporting any pod")
    if not ready.is_set():
        raise TimeoutError(f"discovery reported no pods within {DISCOVERY_START_TIMEOUT_S} s")


async def _evict_periodically(table: SyncPrefixHashTable, settings: Settings) -> None:
    while True:
        await asyncio.sleep(settings.index.limits.eviction_interval_s)
        table.evict()


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    gateway = getattr(request.app.state, "gateway", None)
    return refusal(exc, None if gateway is None else gateway.metrics)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    body = {"error": {"message": exc.detail, "type": "invalid_request_error", "param": None,
                      "code": exc.status_code}}  # fmt: skip
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


class _CutConnections:
    """An engine failure after the response started ends it unfinished: uvicorn then drops
    the client's connection, as the engine's own failure would have. Inside it, request ids
    and the access log (`gateway/http/request_id.py`) wrap the whole app, errors included; then
    the forwarded client address (with `KVGATE_TRUSTED_PROXIES`,
    `gateway/http/client_address.py`), the concurrency limit, then the generation lane
    (`api.GenerationLane`) in front of the starlette app that serves every other route."""

    def __init__(
        self,
        app: ASGIApp,
        starlette: Starlette,
        *,
        access_log: bool = True,
        admin_port: int | None = None,
        on_invalid_header: Callable[[str], None] | None = None,
    ) -> None:
        self.app = RequestIds(app, access_log=access_log, on_invalid=on_invalid_header)
        self.state = starlette.state  # the gateway state, for embedding code and tests
        self.admin_port = admin_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.admin_port is not None and scope["type"] == "http" and not self._on_its_port(scope):
            await _not_here(scope, receive, send)
            return
        with contextlib.suppress(UpstreamCut, ClientGone):
            await self.app(scope, receive, send)

    def _on_its_port(self, scope: Scope) -> bool:
        """With KVGATE_ADMIN_PORT, /metrics and /admin/* live there and only there."""
        server = scope.get("server")
        on_admin_port = server is not None and server[1] == self.admin_port
        path: str = scope.get("path", "")
        operator = path == "/metrics" or path == "/admin" or path.startswith("/admin/")
        return operator == on_admin_port or path in ("/health", "/ready")


async def _not_here(scope: Scope, receive: Receive, send: Send) -> None:
    """404 in OpenAI's shape: this path is served on the other port."""
    error = NotFound(f"{clip(str(scope.get('path')))} is not served on this port")
    await error.response()(scope, receive, send)
