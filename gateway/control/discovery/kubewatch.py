"""The blocking half of Kubernetes discovery: one thread per watched collection (the
selected pods of a namespace, an InferencePool) lists and watches it with the `kubernetes`
client and posts what it sees, as immutable messages, to the event loop (which alone
touches the pod registry).

The list/watch protocol (https://kubernetes.io/docs/reference/using-api/api-concepts/):
list (paginated with limit/continue) → watch from the list's resourceVersion → track the
resourceVersion of every event and BOOKMARK → when a watch ends (server timeout, dropped
connection, error) watch again from the last one → when that resourceVersion is too old
(410 Gone, as an HTTP status or as an ERROR event) list again and let the loop diff.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

GONE = 410
# A first list failing with these is a configuration mistake (bad selector, no RBAC,
# wrong namespace), not an outage: start-up stops with it instead of retrying forever.
_FATAL_AT_START = frozenset((400, 401, 403, 404))


@dataclass(frozen=True, slots=True)
class WatchTiming:
    watch_timeout_s: int = 30
    """Server-side `timeoutSeconds` of one watch request (then it is renewed)."""
    connect_timeout_s: float = 5.0
    read_slack_s: float = 10.0
    """The client's read timeout is the watch timeout plus this: a silent, dead
    connection is noticed, a quiet watch is not mistaken for one."""
    page_size: int = 500
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Listed:
    """A collection's complete (selected) list: the loop diffs it against its view."""

    key: str
    """The watcher it comes from (`ListWatcher.key`)."""
    items: list[dict[str, Any]]
    relist: bool
    """False for the watcher's first list."""


@dataclass(frozen=True, slots=True)
class Changed:
    """One ADDED, MODIFIED or DELETED watch event."""

    key: str
    type: str
    obj: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failed:
    key: str
    error: Exception
    fatal: bool
    """The thread has stopped: the first list showed a configuration mistake."""

    listed: bool = False
    """The watcher had listed before this failure."""


Message = Listed | Changed | Failed


class ExpiredError(Exception):
    """The resourceVersion (or continue token) is too old: list again."""


class WatchEventError(Exception):
    """An ERROR event other than 410 (its Status object's code and message)."""

    def __init__(self, status: dict[str, Any]) -> None:
        super().__init__(f"watch error {status.get('code')}: {status.get('message')}")
        self.code = status.get("code")


class ListWatcher:
    """Lists and watches one collection in its own thread: `open_request(**params)` opens
    one list or watch request (a `kubernetes` client `list_*` method with its path and
    selectors bound, e.g. `list_namespaced_pod` for one namespace and label selector).

    `stop` can be called from any thread: it ends the backoff wait and shuts the socket
    of the request in progress down, so the thread ends promptly. With
    `stop_on_config_error`, a first list rejected as a configuration mistake ends the
    thread (its `Failed` is `fatal`); without it, that is retried like any failure.
    """

    def __init__(
        self,
        open_request: Callable[..., Any],
        key: str,
        post: Callable[[Message], None],
        *,
        timing: WatchTiming,
        rng: random.Random,
        stop_on_config_error: bool = True,
    ) -> None:
        self._open_request = open_request
        self.key = key
        self._post = post
        self._timing = timing
        self._rng = rng
        self._stop_on_config_error = stop_on_config_error
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None
        self.resource_version: str | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"kvgate-k8s-watch-{key}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                if hasattr(response, "shutdown"):  # urllib3 >= 2.3
                    response.shutdown()  # unblocks the thread's read at once
                else:
                    response.connection.sock.shutdown(socket.SHUT_RDWR)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        listed = False
        failures = 0
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    self.resource_version = self._list(relist=listed)
                    listed = True
                if not self._watch():
                    # Ended without a line (a proxy closing at once?): do not spin.
                    self._stopping.wait(self._timing.backoff_initial_s)
                failures = 0
            except ExpiredError as exc:
                logger.info("kubernetes %s: %s; listing again", self.key, exc)
                self.resource_version = None
            except Exception as exc:  # every failure is reported, then retried
                if self._stopping.is_set():
                    return
                fatal = (
                    self._stop_on_config_error
                    and not listed
                    and getattr(exc, "status", None) in _FATAL_AT_START
                )
                self._post(Failed(self.key, exc, fatal, listed))
                if fatal:
                    return
                failures += 1
                self._stopping.wait(self._backoff(failures))

    def _backoff(self, failures: int) -> float:
        """Exponential, half of it random, so gateway replicas do not retry in step."""
        timing = self._timing
        cap = min(timing.backoff_max_s, timing.backoff_initial_s * 2.0 ** (failures - 1))
        return cap / 2 + self._rng.random() * cap / 2

    def _list(self, *, relist: bool) -> str:
        items: list[dict[str, Any]] = []
        resource_version: str | None = None
        token: str | None = None
        while True:
            extra = {"_continue": token} if token else {}
            body = json.loads(self._request(limit=self._timing.page_size, **extra))
            metadata = body.get("metadata") or {}
            # Every page is the same snapshot; its version is where the watch starts.
            resource_version = resource_version or metadata.get("resourceVersion")
            items.extend(body.get("items") or [])
            token = metadata.get("continue")
            if not token:
                break
        if not resource_version:
            raise ValueError(f"the {self.key} list carries no resourceVersion")
        self._post(Listed(self.key, items, relist))
        return resource_version

    def _watch(self) -> bool:
        """One watch request, from `resource_version` until the server ends it; whether
        it received anything."""
        timing = self._timing
        response = self._open(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version,
            timeout_seconds=timing.watch_timeout_s,
            _request_timeout=(
                timing.connect_timeout_s,
                timing.watch_timeout_s + timing.read_slack_s,
            ),
        )
        from kubernetes.watch.watch import iter_resp_lines  # the package loads only if used

        received = False
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]  # kubernetes: untyped
                received = True
                if self._stopping.is_set():
                    break
                if line:
                    self._event(json.loads(line))
            return received
        finally:
            self._close(response)

    def _event(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == GONE:
                raise ExpiredError(obj.get("message") or "resourceVersion expired")
            raise WatchEventError(obj)
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._post(Changed(self.key, kind, obj))
        if version:  # BOOKMARKs only move the version on: nothing changed before it
            self.resource_version = version

    def _request(self, **params: Any) -> bytes:
        timing = self._timing
        timeout = (timing.connect_timeout_s, timing.connect_timeout_s + timing.read_slack_s)
        response = self._open(_request_timeout=timeout, **params)
        try:
            data: bytes = response.read()
            return data
        finally:
            self._close(response)

    def _open(self, **params: Any) -> Any:
        try:
            response = self._open_request(_preload_content=False, **params)
        except Exception as exc:  # kubernetes.client.ApiException carries the HTTP status
            if getattr(exc, "status", None) == GONE:
                raise ExpiredError(f"HTTP 410: {getattr(exc, 'reason', exc)}") from exc
            raise
        with self._lock:
            self._response = response
        if self._stopping.is_set():  # stop() ran before the response could be shut down
            self._close(response)
            raise InterruptedError("stopping")
        return response

    def _close(self, response: Any) -> None:
        with self._lock:
            if self._response is response:
                self._response = None
        response.close()
        response.release_conn()
