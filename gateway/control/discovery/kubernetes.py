"""Pods from the Kubernetes API: list + watch the labelled pods of some namespaces.

The blocking `kubernetes` client runs in one thread per namespace (`kubewatch.py`); this
module owns those threads, applies what they post on the event loop (pod objects become
`Pod`s by `kubepods.py`), and stops them when `run` is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.control.discovery.base import DiscoveryEvents, PodListener, sync_pods
from gateway.control.discovery.kubepods import pod_from_object, pod_key
from gateway.control.discovery.kubewatch import (
    Changed,
    Failed,
    Listed,
    ListWatcher,
    Message,
    WatchTiming,
)
from gateway.control.discovery.pods import Pod
from gateway.errors import ConfigError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_LABEL_SELECTOR = "model.aibrix.ai/name"
STOP_TIMEOUT_S = 2.0


def load_api_client(env: Mapping[str, str] = os.environ) -> ApiClient:
    """An API client from the in-cluster service account, else from the kubeconfig
    (`KUBECONFIG`, else ~/.kube/config)."""
    from kubernetes import client, config  # imported only when Kubernetes is used

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]  # kubernetes: untyped
    except config.ConfigException as in_cluster:
        kubeconfig = env.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]  # kubernetes: untyped
                config_file=kubeconfig, client_configuration=configuration, persist_config=False
            )
        except (config.ConfigException, OSError, ValueError) as exc:
            raise ConfigError(
                "KUBECONFIG",
                kubeconfig,
                f"a usable kubeconfig when not in a cluster ({in_cluster}; {exc})",
            ) from None
    return client.ApiClient(configuration)


def resolve_namespaces(
    configured: Sequence[str], *, own_namespace_file: Path = SERVICE_ACCOUNT_NAMESPACE
) -> list[str]:
    """The configured namespaces; none: the gateway's own (in a cluster), else `default`."""
    if configured:
        return list(dict.fromkeys(configured))
    with contextlib.suppress(OSError):
        own = own_namespace_file.read_text().strip()
        if own:
            return [own]
    return ["default"]


class KubernetesDiscovery:
    """Reports the pods the label selector picks in `namespaces`, kept current by watches.

    Pods being deleted, without an IP or without a model are not reported (removed if
    they were); pods not Running and Ready are reported with `ready=False` (the registry
    then drops their subscriber and index, and routes nothing to them). Transient API
    failures are retried with backoff, keeping the last good view; only a first list
    rejected as a configuration mistake (bad selector, missing RBAC) makes `run` raise.
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        namespaces: Sequence[str],
        label_selector: str = DEFAULT_LABEL_SELECTOR,
        timing: WatchTiming | None = None,
        rng: random.Random | None = None,
        events: DiscoveryEvents | None = None,
        close_client: bool = False,
    ) -> None:
        if not namespaces:
            raise ConfigError("KVGATE_K8S_NAMESPACES", "", "at least one namespace")
        self._api_client = api_client
        self.namespaces = list(dict.fromkeys(namespaces))
        self.label_selector = label_selector
        self._timing = timing or WatchTiming()
        self._rng = rng or random.Random()
        self.events = events or DiscoveryEvents()
        self.errors = 0
        self.relists = 0
        self._qualified = len(self.namespaces) > 1
        self._close_client = close_client
        self._watchers: list[ListWatcher] = []

    @classmethod
    def from_environment(
        cls, namespaces: Sequence[str], label_selector: str, **kwargs: Any
    ) -> KubernetesDiscovery:
        return cls(
            load_api_client(),
            namespaces=resolve_namespaces(namespaces),
            label_selector=label_selector,
            close_client=True,
            **kwargs,
        )

    def request_reload(self) -> None:
        """Nothing to do: the watch already reports every change as it happens."""

    async def run(self, listener: PodListener, ready: asyncio.Event) -> None:
        from kubernetes.client import CoreV1Api

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Message] = asyncio.Queue()

        def post(message: Message) -> None:  # called from the watcher threads
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, message)

        api = CoreV1Api(self._api_client)
        watchers = [
            ListWatcher(
                functools.partial(
                    api.list_namespaced_pod, namespace, label_selector=self.label_selector
                ),
                namespace,
                post,
                timing=self._timing,
                rng=random.Random(self._rng.random()),
            )
            for namespace in self.namespaces
        ]
        self._watchers = watchers
        views: dict[str, dict[str, Pod]] = {namespace: {} for namespace in self.namespaces}
        unlisted = set(self.namespaces)
        for watcher in watchers:
            watcher.start()
        try:
            while True:
                message = await queue.get()
                await self._apply(message, listener, views[message.key])
                if isinstance(message, Listed) and message.key in unlisted:
                    unlisted.discard(message.key)
                    if not unlisted:
                        ready.set()
        finally:
            await stop_watchers(watchers)
            if self._close_client:
                self._api_client.close()  # type: ignore[no-untyped-call]  # kubernetes: untyped

    def resource_versions(self) -> dict[str, str | None]:
        """Per namespace, the resourceVersion the watch resumes from (None: listing)."""
        return {w.key: w.resource_version for w in self._watchers}

    async def _apply(self, message: Message, listener: PodListener, view: dict[str, Pod]) -> None:
        if isinstance(message, Failed):
            self._failed(message)
            if message.fatal:
                raise _config_error(message, self.label_selector)
            return
        if isinstance(message, Listed):
            if message.relist:
                self.relists += 1
                self.events.relist()
            pods = [self._pod(obj) for obj in message.items]
            await sync_pods(listener, view, [pod for pod in pods if pod is not None])
            return
        assert isinstance(message, Changed)
        name = pod_key(message.obj, qualified=self._qualified)
        pod = None if message.type == "DELETED" else self._pod(message.obj)
        if pod is None:
            if view.pop(name, None) is not None:
                await listener.remove_pod(name)
        elif view.get(name) != pod:
            view[name] = pod
            await listener.upsert_pod(pod)

    def _pod(self, obj: dict[str, Any]) -> Pod | None:
        """The pod to report; None (with the error counted) for a misconfigured one."""
        try:
            return pod_from_object(obj, name=pod_key(obj, qualified=self._qualified))
        except ConfigError as exc:
            logger.error("kubernetes pod ignored: %s", exc)
            self._count_error(exc)
            return None

    def _failed(self, message: Failed) -> None:
        logger.warning(
            "kubernetes discovery (namespace %s) failed%s: %s",
            message.key,
            "" if message.fatal else ", retrying",
            describe(message.error),
        )
        self._count_error(message.error)

    def _count_error(self, error: Exception) -> None:
        self.errors += 1
        self.events.error(error)


def describe(error: Exception) -> str:
    """One line for an API error: status, reason and the Status object's message (the
    client's own text spans lines and includes every header)."""
    status = getattr(error, "status", None)
    if status is None:
        return f"{type(error).__name__}: {error}"
    try:
        detail = json.loads(getattr(error, "body", None) or "{}").get("message", "")
    except (ValueError, AttributeError):
        detail = ""
    return f"HTTP {status} {getattr(error, 'reason', '')}: {detail}".rstrip(": ")


def _config_error(message: Failed, selector: str) -> ConfigError:
    status = getattr(message.error, "status", None)
    if status == 400:
        return ConfigError("KVGATE_K8S_LABEL_SELECTOR", selector, "a valid label selector")
    return ConfigError(
        "KVGATE_K8S_NAMESPACES",
        message.key,
        "a namespace whose pods the gateway may get/list/watch "
        f"(the API answered {describe(message.error)})",
    )


async def stop_watchers(watchers: list[ListWatcher]) -> None:
    """Stop the threads; wait a bounded time (they are daemons: a stuck connect cannot
    hold the process, and it ends on its own timeout)."""
    for watcher in watchers:
        watcher.stop()

    def join() -> None:
        for watcher in watchers:
            watcher.join(STOP_TIMEOUT_S)

    await asyncio.to_thread(join)
    for watcher in watchers:
        if watcher.is_alive():
            logger.warning("kubernetes watch thread for %s still stopping", watcher.key)
