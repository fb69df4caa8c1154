"""Pods from an InferencePool: watch the pool, then the pods its selector picks.

Two `ListWatcher` threads (`kubewatch.py`): one on the pool (a field selector on its
name), one on the pods of its namespace with the pool's `matchLabels`. Each selected
pod becomes one endpoint per target port (`poolspec.py` names them), mapped like any
Kubernetes pod (`kubepods.py`: model, engine, KV-event opt-in, readiness).

The pool is followed (docs/kubernetes.md): a new selector replaces the pod watch, new
target ports re-map the known pods, a deleted or missing pool empties the endpoint set
until it exists, a malformed one is ignored and counted (the last good spec stays).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.control.discovery.base import DiscoveryEvents, PodListener, sync_pods
from gateway.control.discovery.kubepods import MODEL, pod_from_object
from gateway.control.discovery.kubernetes import (
    describe,
    load_api_client,
    resolve_namespaces,
    stop_watchers,
)
from gateway.control.discovery.kubewatch import (
    Changed,
    Failed,
    Listed,
    ListWatcher,
    Message,
    WatchTiming,
)
from gateway.control.discovery.pods import Pod
from gateway.control.discovery.poolspec import GROUP, PLURAL, VERSION, PoolRef, PoolSpec, pool_spec
from gateway.errors import ConfigError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

logger = logging.getLogger(__name__)

POOL = "pool"
VARIABLE = "KVGATE_INFERENCE_POOL"


class InferencePoolDiscovery:
    """Reports the endpoints (pod × target port) of one InferencePool, kept current by
    watches on the pool and its pods. Transient API failures are retried with backoff,
    keeping the last good view; only a first list refused as a configuration mistake (no
    InferencePool CRD, missing RBAC) makes `run` raise."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        namespace: str,
        name: str,
        timing: WatchTiming | None = None,
        rng: random.Random | None = None,
        events: DiscoveryEvents | None = None,
        close_client: bool = False,
    ) -> None:
        self._api_client = api_client
        self.namespace = namespace
        self.name = name
        self.where = f"InferencePool {namespace}/{name}"
        self._timing = timing or WatchTiming()
        self._rng = rng or random.Random()
        self.events = events or DiscoveryEvents()
        self._close_client = close_client
        self.errors = 0
        self.relists = 0
        self.spec: PoolSpec | None = None
        """The pool's last good spec; None while it does not exist."""
        self._pods: dict[str, dict[str, Any]] = {}  # the selected pod objects, by name
        self._endpoints: dict[str, Pod] = {}  # what the listener was told
        self._modelless: set[str] = set()  # pods already warned about
        self._pool_watcher: ListWatcher | None = None
        self._pod_watcher: ListWatcher | None = None
        self._generation = 0
        self._pods_listed = False
        self._retired: list[ListWatcher] = []
        self._started = False
        self._post: Callable[[Message], None] = lambda message: None  # set by `run`

    @classmethod
    def from_environment(cls, reference: str, **kwargs: Any) -> InferencePoolDiscovery:
        ref = PoolRef.parse(reference)
        namespace = ref.namespace or resolve_namespaces([])[0]
        return cls(
            load_api_client(), namespace=namespace, name=ref.name, close_client=True, **kwargs
        )

    def request_reload(self) -> None:
        """Nothing to do: the watches already report every change as it happens."""

    async def run(self, listener: PodListener, ready: asyncio.Event) -> None:
        from kubernetes.client import CustomObjectsApi

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Message] = asyncio.Queue()

        def post(message: Message) -> None:  # called from the watcher threads
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, message)

        self._post = post
        custom = CustomObjectsApi(self._api_client)
        list_pools = functools.partial(
            custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
            field_selector=f"metadata.name={self.name}",
        )  # fmt: skip
        self._pool_watcher = self._watcher(list_pools, POOL, stop_on_config_error=True)
        self._pool_watcher.start()
        pool_listed = False
        try:
            while True:
                message = await queue.get()
                await self._apply(message, listener)
                pool_listed = pool_listed or (isinstance(message, Listed) and message.key == POOL)
                if pool_listed and (self.spec is None or self._pods_listed):
                    self._started = True
                    ready.set()
        finally:
            watchers = [self._pool_watcher, self._pod_watcher, *self._retired]
            await stop_watchers([w for w in watchers if w is not None])
            if self._close_client:
                self._api_client.close()  # type: ignore[no-untyped-call]  # kubernetes: untyped

    def _watcher(
        self, open_request: Callable[..., Any], key: str, *, stop_on_config_error: bool
    ) -> ListWatcher:
        return ListWatcher(
            open_request, key, self._post, timing=self._timing,
            rng=random.Random(self._rng.random()), stop_on_config_error=stop_on_config_error,
        )  # fmt: skip

    async def _apply(self, message: Message, listener: PodListener) -> None:
        pods_key = self._pod_watcher.key if self._pod_watcher is not None else None
        if message.key not in (POOL, pods_key):
            return  # from a pod watch the pool's new selector replaced
        if isinstance(message, Failed):
            self._failed(message)
            return
        if isinstance(message, Listed) and message.relist:
            self.relists += 1
            self.events.relist()
        if message.key == POOL:
            if isinstance(message, Listed):
                pools = [o for o in message.items if _name(o) == self.name]
                await self._set_pool(pools[0] if pools else None, listener)
            elif isinstance(message, Changed) and _name(message.obj) == self.name:
                await self._set_pool(None if message.type == "DELETED" else message.obj, listener)
            return
        if isinstance(message, Listed):
            self._pods = {_name(obj): obj for obj in message.items if _name(obj)}
            self._pods_listed = True
            await self._sync(listener)
            return
        assert isinstance(message, Changed)
        name = _name(message.obj)
        if not name:
            return
        if message.type == "DELETED":
            self._pods.pop(name, None)
            self._modelless.discard(name)
        else:
            self._pods[name] = message.obj
        await self._sync(listener, only=name)

    async def _set_pool(self, obj: dict[str, Any] | None, listener: PodListener) -> None:
        if obj is None:
            if self.spec is not None or not self._started:
                logger.warning("%s %s: no endpoints until it exists", self.where,
                               "deleted" if self.spec is not None else "not found")  # fmt: skip
            self.spec = None
            self._replace_pod_watch(None)
            await self._sync(listener)
            return
        try:
            spec = pool_spec(obj, self.where)
        except ConfigError as exc:
            logger.error("%s ignored, keeping its last good spec: %s", self.where, exc)
            self._count_error(exc)
            return
        if spec == self.spec:
            return
        old, self.spec = self.spec, spec
        logger.info("%s: pods %s, target ports %s", self.where, spec.label_selector,
                    ",".join(map(str, spec.target_ports)))  # fmt: skip
        if old is None or old.match_labels != spec.match_labels:
            self._replace_pod_watch(spec)
        await self._sync(listener)

    def _replace_pod_watch(self, spec: PoolSpec | None) -> None:
        """Stop the pod watch (its late messages are ignored), forget the pods the new
        selector does not pick, and watch with it."""
        if self._pod_watcher is not None:
            self._pod_watcher.stop()
            self._retired = [w for w in self._retired if w.is_alive()] + [self._pod_watcher]
            self._pod_watcher = None
        self._pods_listed = False
        if spec is None:
            self._pods.clear()
            return
        self._pods = {name: obj for name, obj in self._pods.items() if spec.selects(obj)}
        from kubernetes.client import CoreV1Api

        self._generation += 1
        list_pods = functools.partial(
            CoreV1Api(self._api_client).list_namespaced_pod, self.namespace,
            label_selector=spec.label_selector,
        )  # fmt: skip
        self._pod_watcher = self._watcher(
            list_pods, f"pods-{self._generation}", stop_on_config_error=not self._started
        )
        self._pod_watcher.start()

    async def _sync(self, listener: PodListener, *, only: str | None = None) -> None:
        """Report the endpoints of every known pod (or of pod `only`, whose endpoint
        names the unchanged spec fixes)."""
        if only is None:
            wanted = [e for name in self._pods for e in self._endpoints_of(name)]
            await sync_pods(listener, self._endpoints, wanted)
            return
        spec = self.spec
        if spec is None:
            return
        names = [spec.endpoint_name(only, rank) for rank in range(len(spec.target_ports))]
        endpoints = {e.name: e for e in self._endpoints_of(only)}
        for name in names:
            endpoint = endpoints.get(name)
            if endpoint is None:
                if self._endpoints.pop(name, None) is not None:
                    await listener.remove_pod(name)
            elif self._endpoints.get(name) != endpoint:
                self._endpoints[name] = endpoint
                await listener.upsert_pod(endpoint)

    def _endpoints_of(self, pod_name: str) -> list[Pod]:
        spec, obj = self.spec, self._pods.get(pod_name)
        if spec is None or obj is None or not spec.selects(obj):
            return []
        endpoints: list[Pod] = []
        try:
            for rank, port in enumerate(spec.target_ports):
                endpoint = pod_from_object(
                    obj, name=spec.endpoint_name(pod_name, rank), http_port=port, rank=rank
                )
                if endpoint is None:
                    self._warn_modelless(obj, pod_name)
                    return []
                endpoints.append(endpoint)
            self._modelless.discard(pod_name)
        except ConfigError as exc:
            logger.error("%s: pod ignored: %s", self.where, exc)
            self._count_error(exc)
            return []
        return endpoints

    def _warn_modelless(self, obj: dict[str, Any], pod_name: str) -> None:
        """A selected pod with an IP but no model is a mistake worth one warning."""
        metadata, status = obj.get("metadata") or {}, obj.get("status") or {}
        model = (metadata.get("labels") or {}).get(MODEL) or (
            metadata.get("annotations") or {}).get(MODEL)  # fmt: skip
        if model or metadata.get("deletionTimestamp") or not status.get("podIP"):
            return
        if pod_name not in self._modelless:
            self._modelless.add(pod_name)
            error = ConfigError(f"{self.where}: pod {pod_name}: label {MODEL}", None,
                                "the model the pod serves (label or annotation)")  # fmt: skip
            logger.error("pod not routed: %s", error)
            self._count_error(error)

    def _failed(self, message: Failed) -> None:
        what = "the pool" if message.key == POOL else "its pods"
        logger.warning("%s: watching %s failed%s: %s", self.where, what,
                       "" if message.fatal else ", retrying", describe(message.error))  # fmt: skip
        self._count_error(message.error)
        if message.fatal:
            resource = "inferencepools" if message.key == POOL else "pods"
            raise ConfigError(
                VARIABLE, f"{self.namespace}/{self.name}",
                f"a pool the gateway may read: get/list/watch {resource} in {self.namespace}"
                + (", and the InferencePool CRD (inference.networking.k8s.io/v1) installed"
                   if message.key == POOL else "")
                + f" (the API answered {describe(message.error)})",
            )  # fmt: skip

    def _count_error(self, error: Exception) -> None:
        self.errors += 1
        self.events.error(error)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))
