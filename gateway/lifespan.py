"""The gateway's start-up: every component built in dependency order, each given what it
uses when it is built (nothing is set on an object afterwards), then the background tasks
started under supervision.

Start-up: HTTP clients, the cost model (from a peer), index snapshots (files), the
subscriber manager, the pod registry, the snapshot writer, the model catalog, the
tokenizer, replica sync, the pin manager, the router, the upstream; then discovery (its
first load must succeed), the metrics scraper, the tokenizer preload, the index eviction
timer, the dead-pod reaper, pin reconciliation, the model catalog, replica sync and the
snapshot writer. Shutdown (after uvicorn has stopped accepting and drained connections),
in the reverse order of the exit stack: stop every background task, unpin, close replica
sync, write a final snapshot, stop every subscriber, close the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.control.discovery import Discovery, run_resynced
from gateway.control.persistence import (
    BootstrapMetrics,
    SnapshotRestorer,
    SnapshotWriter,
    cost_model_from_peer,
    restore_snapshots,
    snapshot_writer,
)
from gateway.control.pinning.client import PinClient
from gateway.control.pinning.manager import PinConfig, PinManager
from gateway.control.pinning.metrics import PinMetrics
from gateway.control.reaper import DeadPodReaper
from gateway.control.registry import PodRegistry
from gateway.control.replication import (
    CurveKeys,
    RegistryFleet,
    ReplicaSync,
    ReplicaSyncCollector,
)
from gateway.control.supervisor import Supervisor
from gateway.observability.metrics import GatewayMetrics
from gateway.routing.router import Router, build_policies
from gateway.settings import Settings
from gateway.state import GatewayState
from gateway.upstream.http1 import Http1Pool
from gateway.upstream.local_tokenizer import LocalTokenizers
from gateway.upstream.model_catalog import ModelCatalog
from gateway.upstream.prompt_tokenizer import PromptTokenizer
from gateway.upstream.proxy import Upstream
from gateway.upstream.scraper import MetricsScraper
from gateway.upstream.tokenizer import RemoteTokenizer
from indexer import SyncPrefixHashTable
from predictor import Predictor
from subscriber import IndexSink, SubscriberManager

logger = logging.getLogger(__name__)

DISCOVERY_START_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Foundation:
    """What the app factory builds before the lifespan runs (and tests may inject)."""

    settings: Settings
    discovery: Discovery
    transport: httpx.AsyncBaseTransport | None
    metrics: GatewayMetrics
    table: SyncPrefixHashTable
    rng: random.Random
    keys: CurveKeys | None


@dataclass(frozen=True, slots=True)
class _Clients:
    pool: Http1Pool
    """Proxied requests to the engines."""
    tokenizer_pool: Http1Pool
    """The engines' /tokenize."""
    control: httpx.AsyncClient
    """Everything else: scrapes, model cards, pins, a peer's cost model."""


async def start_gateway(base: Foundation, stack: contextlib.AsyncExitStack) -> GatewayState:
    """Build the gateway on `stack` (which closes it, in reverse), start its background
    tasks, and return it once discovery has reported the first pods."""
    settings, metrics, table = base.settings, base.metrics, base.table
    clients = await _clients(base, stack)
    cost = await _cost_model(base, clients.control)
    subscribers, restorer = await _subscribers(base, stack, clients.control, cost)
    registry = PodRegistry(
        table=table,
        subscribers=subscribers,
        on_pod=lambda pod: metrics.known_pod(pod, settings.default_policy),
        chat_tokenizer=_engines_render_chats(settings),
    )
    writer = _writer(base, stack, subscribers, registry, restorer, cost)
    models = ModelCatalog(registry, clients.control,
                          interval_s=max(settings.scrape_interval_s, 10.0))  # fmt: skip
    tokenizer = (
        _prompt_tokenizer(settings, stack, clients.tokenizer_pool, models)
        if settings.use_remote_tokenizer
        else None
    )
    sync = _replica_sync(base, stack, cost, registry, models)
    pins = _pin_manager(settings, table, registry, clients.control, metrics.pins)
    stack.push_async_callback(pins.close)  # unpin all: after the tasks stop, before the client
    router = Router(
        registry=registry,
        table=table,
        tokenizer=tokenizer,
        policies=build_policies(
            settings, base.rng, cost=cost, affinity=pins.affinity, timer=metrics.routing.time_plugin
        ),
        default_policy=settings.default_policy,
        metrics=metrics.routing,
        cost=cost,
        sink=sync,
        max_prompt_tokens=settings.max_prompt_tokens,
        log_predictions=settings.prediction_log,
    )
    metrics.watch_fleet(registry, table, lambda: subscribers.rejects if subscribers else None, cost)
    metrics.prometheus.register(ReplicaSyncCollector(lambda: sync))
    background = Supervisor(metrics.control.background_restarts)
    stack.push_async_callback(background.stop)
    gateway = GatewayState(
        settings=settings,
        table=table,
        metrics=metrics,
        registry=registry,
        router=router,
        upstream=Upstream(clients.pool, metrics.upstream, pulse=cost.pulse),
        subscribers=subscribers,
        started_at=int(time.time()),
        discovery=base.discovery,
        pins=pins,
        replica_sync=sync,
        models=models,
        background=background,
    )
    await _start_background(gateway, cost, tokenizer, writer, clients.control)
    logger.info("kvgate gateway ready: %d pods", len(registry.all()))
    return gateway


async def _clients(base: Foundation, stack: contextlib.AsyncExitStack) -> _Clients:
    settings = base.settings
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
    control = await stack.enter_async_context(
        httpx.AsyncClient(transport=base.transport, timeout=5.0)
    )
    return _Clients(pool, tokenizer_pool, control)


async def _cost_model(base: Foundation, client: httpx.AsyncClient) -> Predictor:
    """The cost model; with `KVGATE_BOOTSTRAP_PEER`, its state from a running peer (the
    fresher view: before any file's)."""
    settings = base.settings
    cost = Predictor(settings.cost_params())
    bootstrap_metrics = BootstrapMetrics(base.metrics.prometheus)
    if settings.bootstrap_peer is not None:
        await cost_model_from_peer(
            client, settings.bootstrap_peer, settings.admin_token, cost, bootstrap_metrics
        )
    return cost


async def _subscribers(
    base: Foundation, stack: contextlib.AsyncExitStack, client: httpx.AsyncClient, cost: Predictor
) -> tuple[SubscriberManager | None, SnapshotRestorer | None]:
    """With KV event sync: the index restored from snapshots, then the subscriber manager
    (before discovery starts any subscriber: each starts from its pod's snapshot)."""
    if not base.settings.kv_event_sync:
        return None, None
    restorer = await restore_snapshots(
        base.settings, base.table, base.metrics.prometheus, client, cost
    )
    subscribers = await stack.enter_async_context(
        SubscriberManager(IndexSink(base.table), resume=restorer.resume)
    )
    return subscribers, restorer


def _engines_render_chats(settings: Settings) -> bool:
    """Whether a chat's prompt is tokenized where the engines render it (their chat
    template, through /tokenize or the same files in-process)."""
    return settings.use_remote_tokenizer and (
        settings.tokenizer != "remote"
        or (settings.tokenizer_endpoint is not None and settings.tokenizer_engine == "vllm")
    )


def _writer(
    base: Foundation,
    stack: contextlib.AsyncExitStack,
    subscribers: SubscriberManager | None,
    registry: PodRegistry,
    restorer: SnapshotRestorer | None,
    cost: Predictor,
) -> SnapshotWriter | None:
    writer = snapshot_writer(base.settings, base.table, subscribers, registry, restorer, cost)
    if writer is not None:
        stack.push_async_callback(writer.close)  # the final snapshot, after background tasks
    return writer


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


def _replica_sync(
    base: Foundation,
    stack: contextlib.AsyncExitStack,
    cost: Predictor,
    registry: PodRegistry,
    models: ModelCatalog,
) -> ReplicaSync | None:
    """With `KVGATE_REPLICA_SYNC_BIND`: the channel to the peer replicas, bound now."""
    settings = base.settings
    if settings.replica_sync_bind is None:
        return None
    sync = ReplicaSync(
        bind=settings.replica_sync_bind,
        peers=settings.replica_peers,
        table=base.table,
        cost=cost,
        fleet=RegistryFleet(registry, models, settings.max_prompt_tokens),
        keys=base.keys,
        peer_service=settings.replica_peer_service,
    )
    sync.start()
    stack.callback(sync.close)
    return sync


def _pin_manager(
    settings: Settings,
    table: SyncPrefixHashTable,
    registry: PodRegistry,
    client: httpx.AsyncClient,
    metrics: PinMetrics,
) -> PinManager:
    return PinManager(
        table=table,
        registry=registry,
        client=PinClient(client),
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


async def _start_background(
    gateway: GatewayState,
    cost: Predictor,
    tokenizer: PromptTokenizer | None,
    writer: SnapshotWriter | None,
    client: httpx.AsyncClient,
) -> None:
    """Discovery first (start-up fails if its first load does), then every other task."""
    settings, registry, background = gateway.settings, gateway.registry, gateway.background
    discovery_task = background.start(
        "discovery",
        lambda: run_resynced(
            gateway.discovery,
            registry,
            lambda: [s.name for s in registry.all()],
            gateway.discovery_ready,
        ),
        restart_if=gateway.discovery_ready.is_set,  # a first load that fails stops start-up
    )
    await _wait_for_discovery(gateway.discovery_ready, discovery_task)
    scraper = MetricsScraper(
        registry,
        client,
        interval_s=settings.scrape_interval_s,
        unhealthy_after=settings.unhealthy_after,
        failures=gateway.metrics.upstream.scrape_failures,
        on_scrape=lambda state, ok: (
            cost.note_scrape(state.name, state.scraped_at)
            if ok and state.scraped_at is not None
            else None
        ),
    )
    background.start("metrics-scraper", scraper.run)
    if tokenizer is not None:
        background.start("tokenizer-load", lambda: tokenizer.preload(registry.models))
    background.start("index-eviction", lambda: _evict_periodically(gateway.table, settings))
    reaper = DeadPodReaper(registry, gateway.upstream, gateway.metrics.control.dead_pod_cuts,
                           grace_s=settings.dead_pod_grace_s)  # fmt: skip
    background.start("dead-pod-reaper", reaper.run)
    background.start("pin-reconcile", gateway.pins.run)
    background.start("model-catalog", gateway.models.run)
    if gateway.replica_sync is not None:
        background.start("replica-sync", gateway.replica_sync.run)
    if writer is not None:
        background.start("snapshot-writer", writer.run)


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
