"""The pods the gateway routes to: discovery's view plus health, load and index state."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from gateway.control.discovery import Pod
from indexer import ModelContext, SyncPrefixHashTable
from subscriber import PodEndpoint, PodSubscriberStatus, SubscriberManager

logger = logging.getLogger(__name__)
_UNINDEXABLE_AFTER_BLOCKS = 64
"""Broken-chain blocks, with nothing indexed, after which a pod is called unindexable."""
_MAX_CACHED_MODELS = 1024


class PodState:
    """A pod and what the gateway observes of it (mutated only on the event loop).

    A change of `healthy` is reported to `on_routable_change` (the registry's cache of each
    model's routable pods); `pod` is replaced only through the registry."""

    __slots__ = ("_healthy", "_on_routable_change", "failed_scrapes", "inflight",
                 "kv_usage", "pod", "running", "scraped_at", "waiting")  # fmt: skip

    def __init__(self, pod: Pod, on_routable_change: Callable[[], None] | None = None) -> None:
        self.pod = pod
        self.inflight = 0
        """Requests the gateway is proxying to it right now."""
        self.running = 0.0
        self.waiting = 0.0
        self.kv_usage = 0.0
        """From the engine's /metrics (0 until scraped)."""
        self._healthy = True
        self.failed_scrapes = 0
        self.scraped_at: float | None = None
        self._on_routable_change = on_routable_change

    @property
    def name(self) -> str:
        return self.pod.name

    @property
    def healthy(self) -> bool:
        """Whether its /metrics answers (per the metrics scraper)."""
        return self._healthy

    @healthy.setter
    def healthy(self, healthy: bool) -> None:
        if healthy != self._healthy:
            self._healthy = healthy
            if self._on_routable_change is not None:
                self._on_routable_change()

    @property
    def routable(self) -> bool:
        """Ready (per discovery) and healthy."""
        return self.pod.ready and self._healthy

    def __repr__(self) -> str:
        return (f"PodState({self.pod.name!r}, healthy={self._healthy}, inflight={self.inflight}, "
                f"running={self.running}, waiting={self.waiting})")  # fmt: skip


class _Serving:
    """One model's serving pods as the request path asks for them (cached per model)."""

    __slots__ = ("context", "names", "pods", "routable", "routable_names")

    def __init__(self, pods: list[PodState], model: str) -> None:
        self.pods = pods
        self.names = tuple(s.pod.name for s in pods)
        self.routable = tuple(s for s in pods if s.routable)
        self.routable_names = tuple(s.pod.name for s in self.routable)
        self.context: ModelContext | None = None
        if pods:
            base = any(s.pod.model == model for s in pods)
            self.context = ModelContext(model) if base else ModelContext(pods[0].pod.model, model)


class PodRegistry:
    """Listens to discovery; keeps the index and the KV event subscribers in step with it.

    A pod that publishes events gets a subscriber (which registers it in the index); any
    other pod is registered in approximate mode (router-side entries only). A pod that is
    not Ready is kept, subscribed, but not routed; a pod that goes loses its subscriber and
    its index entries.
    """

    def __init__(
        self,
        *,
        table: SyncPrefixHashTable,
        subscribers: SubscriberManager | None,
        chat_tokenizer: bool = False,
        on_pod: Callable[[Pod], None] | None = None,
    ) -> None:
        self._table = table
        self._on_pod = on_pod
        """Hears of every pod discovery reports, new or updated (its metric series start at
        0 there)."""
        self._chat_tokenizer = chat_tokenizer
        """A tokenizer endpoint that applies chat templates is configured."""
        self._subscribers = subscribers
        self._pods: dict[str, PodState] = {}
        self._serving: dict[str, _Serving] = {}
        """Per model: the pods serving it, their names (what `match` is keyed by), the
        index context of its prefixes and its routable pods (the request path asks for every
        request; dropped whenever a pod comes, goes or changes readiness or health)."""
        self._unindexable: dict[str, str] = {}
        """Pods whose stored blocks all break their chains, with the reason shown."""

    # -- PodListener ----------------------------------------------------------------------

    async def upsert_pod(self, pod: Pod) -> None:
        state = self._pods.get(pod.name)
        if state is None:
            state = self._pods[pod.name] = PodState(pod, self._serving.clear)
            logger.info("pod %s added (%s, model %s)", pod.name, pod.url, pod.model)
            if pod.engine == "sglang" and not self._chat_tokenizer:
                logger.warning(
                    "pod %s is an SGLang engine: its /tokenize takes text prompts only, so chat "
                    "requests to model %s route on load alone unless a vLLM pod serves it too "
                    "or AIBRIX_REMOTE_TOKENIZER_ENDPOINT names a vLLM tokenizer",
                    pod.name, pod.model,
                )  # fmt: skip
        else:
            state.pod = pod
        if self._on_pod is not None:
            self._on_pod(pod)
        self._serving.clear()
        subscribed = self._subscribers is not None and pod.name in self._subscribers.pods()
        # A pod that is not Ready keeps its subscriber and index: it is only not routed. Its
        # cache survives a readiness blip (an engine under load), and so must our view of it.
        if self._subscribers is not None and pod.events is not None:
            peers = await _addresses_of(pod) if pod.events_bind else ()
            await self._subscribers.upsert(_endpoint(pod, peers))
        else:
            if subscribed:
                await self._unsubscribe(pod.name)
            self._table.register_pod(
                pod.name, pod.model, publishes_events=False, lora_names=pod.lora_ids
            )

    async def remove_pod(self, name: str) -> None:
        if self._pods.pop(name, None) is None:
            return
        self._serving.clear()
        self._unindexable.pop(name, None)
        if self._subscribers is not None and name in self._subscribers.pods():
            await self._unsubscribe(name)
        self._table.remove_pod(name)
        logger.info("pod %s removed", name)

    async def _unsubscribe(self, name: str) -> None:
        assert self._subscribers is not None
        await self._subscribers.remove(name)

    # -- queries --------------------------------------------------------------------------

    def get(self, name: str) -> PodState | None:
        return self._pods.get(name)

    def all(self) -> list[PodState]:
        return list(self._pods.values())

    def serving(self, model: str) -> list[PodState]:
        """Pods that serve `model` (as base model or LoRA adapter), routable or not (a new
        list: callers may change it)."""
        return list(self._cached_serving(model).pods)

    def serving_names(self, model: str) -> tuple[str, ...]:
        """The names of `serving(model)`, in its order."""
        return self._cached_serving(model).names

    def routable_serving(self, model: str) -> tuple[tuple[PodState, ...], tuple[str, ...]]:
        """The routable pods of `serving(model)` and their names, in its order (cached until
        a pod comes, goes, changes readiness or health)."""
        cached = self._cached_serving(model)
        return cached.routable, cached.routable_names

    def context(self, model: str) -> ModelContext:
        """Where `model`'s prefixes live in the index: a LoRA adapter's apart from its base
        model's (`model` must have a serving pod)."""
        context = self._cached_serving(model).context
        if context is None:
            raise KeyError(model)
        return context

    def _cached_serving(self, model: str) -> _Serving:
        cached = self._serving.get(model)
        if cached is None:
            if len(self._serving) >= _MAX_CACHED_MODELS:  # any client may name any model
                self._serving.clear()
            pods = [s for s in self._pods.values() if s.pod.serves(model)]
            cached = self._serving[model] = _Serving(pods, model)
        return cached

    def models(self) -> list[str]:
        names: dict[str, None] = {}
        for state in self._pods.values():
            names[state.pod.model] = None
            for lora in state.pod.loras:
                names[lora] = None
        return list(names)

    def routable(self) -> list[PodState]:
        return [s for s in self._pods.values() if s.routable]

    def subscriber_status(self, name: str) -> PodSubscriberStatus | None:
        return self._subscribers.status(name) if self._subscribers is not None else None

    def index_mode(self, name: str) -> str:
        """ "whole", "degraded" (events, but the index may miss blocks), "unindexable"
        (events, but none can be indexed: see `sync_index_modes`) or "approximate"."""
        status = self.subscriber_status(name)
        if status is None:
            return "approximate"
        if name in self._unindexable:
            return "unindexable"
        return "whole" if status.whole else "degraded"

    def unindexable_reason(self, name: str) -> str | None:
        return self._unindexable.get(name)

    def _check_indexable(self, name: str) -> None:
        """A pod whose every stored block breaks its chain (SGLang <= 0.4 publishes
        unchained per-token hashes whose first parent is `hash(())`) has an empty index
        however much it stores: say so once, and route it from router-side entries until
        its blocks chain again."""
        broken = self._table.rejected_blocks(name).get("broken_chain", 0)
        held = self._table.held_blocks(name)
        if name not in self._unindexable:
            if _never_indexed(broken, held):
                reason = (f"{broken} stored blocks broke their chains and none was indexed "
                          "(unchained block hashes, e.g. SGLang <= 0.4)")  # fmt: skip
                self._unindexable[name] = reason
                logger.warning("pod %s is unindexable: %s; routing it from the gateway's "
                               "own entries", name, reason)  # fmt: skip
        elif held > 0:
            del self._unindexable[name]
            logger.info("pod %s: its blocks chain again; indexed from its events", name)

    def sync_index_modes(self) -> None:
        """Pods whose index is not whole keep router-side entries as long as event-less pods.

        Called periodically: a degraded pod's index lacks blocks, so what the router sent
        there is the best knowledge of them.
        """
        for state in self._pods.values():
            if not self._table.has_pod(state.name):
                continue
            self._check_indexable(state.name)
            whole = self.index_mode(state.name) == "whole"
            self._table.register_pod(
                state.name,
                state.pod.model,
                publishes_events=whole,
                lora_names=state.pod.lora_ids,
            )


def _never_indexed(broken: int, held: int) -> bool:
    return held == 0 and broken >= _UNINDEXABLE_AFTER_BLOCKS


async def _addresses_of(pod: Pod) -> tuple[str, ...]:
    """The addresses a pod's engine connects from (its URL's host, resolved), for the bound
    event socket's ZAP check; empty for `ipc://` (file permissions decide there)."""
    assert pod.events is not None
    if not pod.events.startswith("tcp://"):
        return ()
    host = urlsplit(pod.url).hostname or ""
    try:
        return (str(ipaddress.ip_address(host)),)
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None)
    except OSError as exc:
        logger.warning("pod %s: cannot resolve %s (%s): its bound event socket refuses every "
                       "publisher until it resolves", pod.name, host, exc)  # fmt: skip
        return ("unresolved",)
    return tuple(sorted({str(info[4][0]) for info in infos}))


def _endpoint(pod: Pod, peers: tuple[str, ...] = ()) -> PodEndpoint:
    assert pod.events is not None
    return PodEndpoint(
        name=pod.name,
        model=pod.model,
        events=pod.events,
        replay=pod.replay,
        topic=pod.topic,
        bind=pod.events_bind,
        lora_names=pod.lora_ids,
        allowed_peers=peers,
    )
