"""A fake Kubernetes API server: the part of the API that discovery uses, as documented.

- `GET /api/v1/namespaces/{ns}/pods?labelSelector=…&limit=…&continue=…`: a `PodList`
  (`metadata.resourceVersion`, `metadata.continue` between pages of one snapshot); the
  same for `/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools` (an
  `InferencePoolList`; 404 while `crd_installed` is false), both also taking
  `fieldSelector=metadata.name=…`.
- `…&watch=true&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=N`: a stream
  of newline-delimited `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}`
  with every change after RV. As the API server does with a label selector, an object
  that stops matching arrives as DELETED and one that starts matching as ADDED. A
  resourceVersion older than the last compaction is answered 410 Gone (Status reason
  Expired), as an ERROR event (what the API server does for watches) or, when
  `gone_as_http` is set, as an HTTP 410.
- Requests must carry `Authorization: Bearer <token>` (401 Status otherwise); a resource
  in `forbidden` is answered 403, as RBAC does.

Tests drive it from the event loop: create/update/delete objects (pods unless another
`resource` is named), compact, send bookmarks,
drop open watches, make the next requests fail; `requests` records what was asked.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.http.server import GatewayServer

TOKEN = "kvgate-test-token"
Pod = dict[str, Any]
POOLS = "inferencepools"
POOL_API = "inference.networking.k8s.io/v1"
_KINDS = {"pods": ("Pod", "v1"), POOLS: ("InferencePool", POOL_API)}


def pod_object(
    name: str,
    *,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
    ip: str | None = "10.0.0.1",
    phase: str = "Running",
    ready: bool = True,
    ports: dict[str, int] | None = None,
) -> Pod:
    """A Pod as the API returns it (namespace and resourceVersion are set on create)."""
    condition = "True" if ready else "False"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            {"type": kind, "status": condition, "lastProbeTime": None,
             "lastTransitionTime": "2026-11-21T10:00:00Z"}
            for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "hostIP": "192.168.0.10",
        "startTime": "2026-11-21T10:00:00Z",
    }  # fmt: skip
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    container_ports = [
        {"name": port_name, "containerPort": port, "protocol": "TCP"}
        for port_name, port in (ports or {"http": 8000}).items()
    ]
    return {
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": "2026-11-21T10:00:00Z",
            "labels": dict(labels),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "containers": [
                {"name": "engine", "image": "vllm/vllm-openai:v0.10.1", "ports": container_ports}
            ],
            "restartPolicy": "Always",
        },
        "status": status,
    }


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


def pool_object(
    name: str, *, match_labels: dict[str, str] | None = None, ports: tuple[int, ...] = (8000,)
) -> dict[str, Any]:
    """An InferencePool (v1) as the API returns it."""
    return {
        "metadata": {"name": name, "uid": str(uuid.uuid4()), "generation": 1},
        "spec": {
            "selector": {"matchLabels": dict(match_labels or {"app": "vllm"})},
            "targetPorts": [{"number": port} for port in ports],
            "appProtocol": "http",
            "endpointPickerRef": {"group": "", "kind": "Service", "name": "kvgate-epp",
                                  "port": {"number": 9002}, "failureMode": "FailClose"},
        },
    }  # fmt: skip


class Selector:
    """Equality- and existence-based label selectors (`a`, `!a`, `a=b`, `a==b`, `a!=b`), and
    a `metadata.name=…` field selector."""

    def __init__(self, text: str, *, name: str | None = None) -> None:
        self.name = name
        self.terms: list[tuple[str, str, str | None]] = []
        for raw in filter(None, (part.strip() for part in text.split(","))):
            for op in ("!=", "==", "="):
                if op in raw:
                    key, value = (x.strip() for x in raw.split(op, 1))
                    self.terms.append((key, "!=" if op == "!=" else "=", value))
                    break
            else:
                if any(c in raw for c in " ()"):
                    raise ValueError(raw)
                negated = raw.startswith("!")
                self.terms.append((raw.lstrip("!"), "!" if negated else "exists", None))

    def matches(self, obj: Pod | None) -> bool:
        if obj is None:
            return False
        if self.name is not None and obj["metadata"]["name"] != self.name:
            return False
        labels = obj["metadata"].get("labels") or {}
        for key, op, value in self.terms:
            if op == "exists" and key not in labels:
                return False
            if op == "!" and key in labels:
                return False
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
        return True


@dataclass
class _Change:
    rv: int
    resource: str
    namespace: str
    old: Pod | None
    new: Pod | None


@dataclass
class _Watch:
    resource: str
    namespace: str
    selector: Selector
    bookmarks: bool
    queue: asyncio.Queue[bytes | Exception | None] = field(default_factory=asyncio.Queue)


class FakeKubeAPI:
    def __init__(self) -> None:
        self.rv = 1000
        self.objects: dict[tuple[str, str, str], Pod] = {}  # (resource, namespace, name)
        self.crd_installed = True
        self.forbidden: set[str] = set()
        self.log: list[_Change] = []
        self.compacted = 0
        self.gone_as_http = False
        self.fail_next = 0
        self.hold_watches: asyncio.Event | None = None
        """While set to an unset Event, watch requests wait for it before answering."""
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._watches: list[_Watch] = []
        self._snapshots: dict[str, list[Pod]] = {}
        self.app = Starlette(routes=[
            Route("/api/v1/namespaces/{namespace}/pods", self._pods),
            Route(f"/apis/{POOL_API}/namespaces/{{namespace}}/{POOLS}", self._pools),
        ])  # fmt: skip
        self.server = GatewayServer(self.app)

    @property
    def url(self) -> str:
        return self.server.url

    def kubeconfig(self, directory: Path, *, token: str = TOKEN) -> Path:
        """A kubeconfig file pointing at this server (JSON is YAML)."""
        path = directory / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
        }))  # fmt: skip
        return path

    def lists(self, resource: str = "pods") -> list[dict[str, str]]:
        return [params for kind, _, params in self.requests if kind == f"list {resource}" and
                "continue" not in params]  # fmt: skip

    def watches(self, resource: str = "pods") -> list[dict[str, str]]:
        return [params for kind, _, params in self.requests if kind == f"watch {resource}"]

    # -- changes ---------------------------------------------------------------------------

    def create(self, namespace: str, pod: Pod, *, resource: str = "pods") -> Pod:
        name = pod["metadata"]["name"]
        assert (resource, namespace, name) not in self.objects, f"{namespace}/{name} exists"
        pod = copy.deepcopy(pod)
        pod["metadata"]["namespace"] = namespace
        return self._commit(resource, namespace, name, None, pod)

    def update(
        self, namespace: str, name: str, change: Callable[[Pod], None], *, resource: str = "pods"
    ) -> Pod:
        old = self.objects[(resource, namespace, name)]
        new = copy.deepcopy(old)
        change(new)
        return self._commit(resource, namespace, name, old, new)

    def delete(self, namespace: str, name: str, *, resource: str = "pods") -> None:
        old = self.objects[(resource, namespace, name)]
        self._commit(resource, namespace, name, old, None)

    def compact(self) -> None:
        """Forget the history: watches from an older resourceVersion get 410 Gone."""
        self.compacted = self.rv
        self.log.clear()

    def bookmark(self) -> None:
        for watch in self._watches:
            if watch.bookmarks:
                line = _line("BOOKMARK", {"metadata": {"resourceVersion": str(self.rv)}},
                             watch.resource)  # fmt: skip
                watch.queue.put_nowait(line)

    def drop_watches(self, *, abrupt: bool = False) -> None:
        """End every open watch: cleanly (as a server timeout does) or by cutting it."""
        for watch in self._watches:
            watch.queue.put_nowait(ConnectionResetError("dropped") if abrupt else None)

    def open_watches(self) -> int:
        return len(self._watches)

    def _commit(
        self, resource: str, namespace: str, name: str, old: Pod | None, new: Pod | None
    ) -> Pod:
        self.rv += 1
        key = (resource, namespace, name)
        if new is None:
            assert old is not None
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            del self.objects[key]
            change = _Change(self.rv, resource, namespace, old, None)
            final = gone
        else:
            new["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[key] = new
            change = _Change(self.rv, resource, namespace, old, new)
            final = new
        self.log.append(change)
        for watch in self._watches:
            event = _event(change, watch)
            if event is not None:
                watch.queue.put_nowait(event)
        return final

    # -- HTTP ------------------------------------------------------------------------------

    async def _pods(self, request: Request) -> Response:
        return await self._collection("pods", request)

    async def _pools(self, request: Request) -> Response:
        if not self.crd_installed:
            self.requests.append(("missing " + POOLS, request.path_params["namespace"], {}))
            return _status(404, "NotFound", "the server could not find the requested resource")
        return await self._collection(POOLS, request)

    async def _collection(self, resource: str, request: Request) -> Response:
        namespace = request.path_params["namespace"]
        params = dict(request.query_params)
        watching = params.get("watch") in ("true", "1")
        self.requests.append((("watch " if watching else "list ") + resource, namespace, params))
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return _status(401, "Unauthorized", "Unauthorized")
        if resource in self.forbidden:
            return _status(403, "Forbidden", f"cannot list resource {resource!r}")
        if self.fail_next > 0:
            self.fail_next -= 1
            return _status(500, "InternalError", "etcd is having a bad day")
        try:
            selector = Selector(params.get("labelSelector", ""), name=_field(params))
        except ValueError as exc:
            return _status(400, "BadRequest", f"unable to parse requirement: {exc}")
        if watching:
            if self.hold_watches is not None:
                await self.hold_watches.wait()
            return self._watch(resource, namespace, selector, params)
        return self._list(resource, namespace, selector, params)

    def _list(
        self, resource: str, namespace: str, selector: Selector, params: dict[str, str]
    ) -> Response:
        token = params.get("continue")
        if token:
            if token not in self._snapshots:
                return _status(410, "Expired", "The provided continue parameter is too old")
            rv, items = self.rv_of(token), self._snapshots.pop(token)
        else:
            rv = self.rv
            items = [copy.deepcopy(pod) for (kind, ns, _), pod in sorted(self.objects.items())
                     if (kind, ns) == (resource, namespace) and selector.matches(pod)]  # fmt: skip
        limit = int(params.get("limit", "0") or 0)
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and len(items) > limit:
            token = base64.urlsafe_b64encode(f"{rv}:{uuid.uuid4()}".encode()).decode()
            self._snapshots[token] = items[limit:]
            metadata["continue"] = token
            items = items[:limit]
        kind, version = _KINDS[resource]
        return JSONResponse(
            {"kind": f"{kind}List", "apiVersion": version, "metadata": metadata, "items": items}
        )

    @staticmethod
    def rv_of(token: str) -> int:
        return int(base64.urlsafe_b64decode(token).decode().split(":")[0])

    def _watch(
        self, resource: str, namespace: str, selector: Selector, params: dict[str, str]
    ) -> Response:
        since_raw = params.get("resourceVersion", "")
        bookmarks = params.get("allowWatchBookmarks") == "true"
        watch = _Watch(resource, namespace, selector, bookmarks)
        if since_raw in ("", "0"):  # no version: start with the current state
            since = self.rv
            for (kind, ns, _), pod in sorted(self.objects.items()):
                if (kind, ns) == (resource, namespace) and selector.matches(pod):
                    watch.queue.put_nowait(_line("ADDED", pod, resource))
        else:
            since = int(since_raw)
            if since < self.compacted:
                status = status_object(
                    410, "Expired", f"too old resource version: {since} ({self.compacted})"
                )
                if self.gone_as_http:
                    return JSONResponse(status, status_code=410)
                watch.queue.put_nowait(_line("ERROR", status, resource))
                watch.queue.put_nowait(None)
            else:
                for change in self.log:
                    event = _event(change, watch) if change.rv > since else None
                    if event is not None:
                        watch.queue.put_nowait(event)
        timeout = float(params.get("timeoutSeconds", "1800"))
        self._watches.append(watch)
        stream = self._stream(watch, deadline_s=timeout)
        return StreamingResponse(stream, media_type="application/json")

    async def _stream(self, watch: _Watch, *, deadline_s: float) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        try:
            while True:
                try:
                    item = await asyncio.wait_for(watch.queue.get(), deadline - loop.time())
                except TimeoutError:
                    return  # timeoutSeconds: the server ends the watch
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self._watches.remove(watch)


def _line(kind: str, obj: dict[str, Any], resource: str) -> bytes:
    if kind != "ERROR":
        name, version = _KINDS[resource]
        obj = {"kind": name, "apiVersion": version, **obj}
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def _field(params: dict[str, str]) -> str | None:
    """The name a `metadata.name=…` field selector asks for (the only one supported)."""
    raw = params.get("fieldSelector")
    if not raw:
        return None
    key, _, value = raw.replace("==", "=").partition("=")
    if key != "metadata.name" or not value:
        raise ValueError(raw)
    return value


def _event(change: _Change, watch: _Watch) -> bytes | None:
    """The event a watcher with this selector sees for a change, if any."""
    if (change.resource, change.namespace) != (watch.resource, watch.namespace):
        return None
    was, now = watch.selector.matches(change.old), watch.selector.matches(change.new)
    if change.new is None:
        if not was:
            return None
        assert change.old is not None
        gone = copy.deepcopy(change.old)
        gone["metadata"]["resourceVersion"] = str(change.rv)
        return _line("DELETED", gone, change.resource)
    if was and now:
        return _line("MODIFIED", change.new, change.resource)
    if now:
        return _line("ADDED", change.new, change.resource)
    if was:
        return _line("DELETED", change.new, change.resource)
    return None


def _status(code: int, reason: str, message: str) -> Response:
    return JSONResponse(status_object(code, reason, message), status_code=code)
