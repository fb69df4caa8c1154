"""Peer bootstrap: a new replica takes every pod's snapshot from a running gateway, and
its learned cost model.

Engines replay only their last batches, so a replica that starts late cannot rebuild
blocks stored long before from replay alone; a running replica's index holds them. Its
snapshots (`GET /admin/snapshot?pod=NAME`) are restored and resumed exactly like files.
Likewise its cost model (`GET /admin/cost-model`): a replacement that starts from the
prior predicts badly until every pod has answered it a few times, and routes worse
meanwhile (a replica killed under load: TTFT p90 +60 % in the replacement's first 10 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

from gateway.control.persistence.metrics import BootstrapMetrics
from gateway.control.persistence.snapshots import PEER, SnapshotRestorer
from indexer import SnapshotError, decode_snapshot
from predictor import MAX_EXPORT_BYTES, CostStateError, Predictor, parse_export
from predictor.features import MAX_PODS
from predictor.state import MAX_POD_NAME

logger = logging.getLogger(__name__)

BOOTSTRAP_TIMEOUT_S = 30.0


MAX_PODS_LIST_BYTES = 16 * 1024 * 1024
"""Cap of the peer's `/admin/pods` (a pods file's: a few KB a pod at most)."""


class _Refused(Exception):
    """A peer's answer not used: `reason` as the snapshot and bootstrap counters say."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


async def bootstrap_from_peer(
    client: httpx.AsyncClient,
    peer: str,
    token: str | None,
    restorer: SnapshotRestorer,
    *,
    max_bytes: int,
) -> int:
    """Load the peer's snapshot of every pod it subscribes to; returns how many loaded.
    Never fails start-up: an unreachable peer, or a pods list too large or malformed, is
    logged and counted."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        async with asyncio.timeout(BOOTSTRAP_TIMEOUT_S):
            url = f"{peer}/admin/pods"
            data = await _read_capped(client, url, headers, MAX_PODS_LIST_BYTES)
            names = _subscribed(await asyncio.to_thread(_json, data))
            loaded = 0
            for name in names:
                if await _load_one(client, peer, headers, name, restorer, max_bytes):
                    loaded += 1
    except _Refused as exc:
        restorer.ignore(exc.reason, f"pods list from {peer} ({exc.detail})")
        return 0
    except (httpx.HTTPError, TimeoutError) as exc:
        restorer.ignore("peer_unavailable", f"from {peer} ({type(exc).__name__}: {exc})")
        return 0
    logger.info("bootstrap: %d of %d pods' snapshots taken from %s", loaded, len(names), peer)
    return loaded


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise _Refused("malformed", "JSON nested too deeply") from None
    except ValueError as exc:
        raise _Refused("malformed", f"not JSON ({str(exc)[:100]})") from None


def _subscribed(document: Any) -> list[str]:
    """The names of the pods the peer subscribes to, in its `/admin/pods` answer."""
    pods = document.get("pods") if isinstance(document, dict) else None
    if not isinstance(pods, list):
        raise _Refused("malformed", "no list of pods")
    names = [
        pod["name"]
        for pod in pods
        if isinstance(pod, dict)
        and pod.get("subscriber") is not None
        and isinstance(pod.get("name"), str)
        and 0 < len(pod["name"]) <= MAX_POD_NAME
    ]
    return names[:MAX_PODS]


async def _load_one(
    client: httpx.AsyncClient,
    peer: str,
    headers: dict[str, str],
    name: str,
    restorer: SnapshotRestorer,
    max_bytes: int,
) -> bool:
    url = f"{peer}/admin/snapshot"
    try:
        data = await _read_capped(client, url, headers, max_bytes, params={"pod": name})
    except _Refused as exc:
        restorer.ignore(exc.reason, f"of pod {name} from {peer} ({exc.detail})")
        return False
    try:
        snapshot = await asyncio.to_thread(decode_snapshot, data, max_bytes=max_bytes)
    except SnapshotError as exc:
        restorer.ignore(exc.reason, f"of pod {name} from {peer}: {exc.detail}")
        return False
    if snapshot.pod != name:
        restorer.ignore("malformed", f"of pod {name} from {peer}: it names {snapshot.pod!r}")
        return False
    restorer.add(snapshot, PEER)
    return True


async def cost_model_from_peer(
    client: httpx.AsyncClient,
    peer: str,
    token: str | None,
    cost: Predictor,
    metrics: BootstrapMetrics,
) -> int:
    """Start `cost` from the peer's learned models; returns how many were taken. Never
    fails start-up: an unreachable peer, or an answer too large, malformed or out of range
    (`cost_state.py`), is counted and logged in one line, nothing of it taken."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        async with asyncio.timeout(BOOTSTRAP_TIMEOUT_S):
            url = f"{peer}/admin/cost-model"
            data = await _read_capped(client, url, headers, MAX_EXPORT_BYTES)
        taken = cost.adopt(await asyncio.to_thread(parse_export, data))
    except (CostStateError, _Refused) as exc:
        return _rejected(metrics, peer, exc.reason, exc.detail)
    except (httpx.HTTPError, TimeoutError) as exc:
        return _rejected(metrics, peer, "peer_unavailable", f"{type(exc).__name__}: {exc}")
    logger.info("bootstrap: %d cost models taken from %s", taken, peer)
    return taken


async def _read_capped(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    max_bytes: int,
    *,
    params: dict[str, str] | None = None,
) -> bytes:
    """The answer's body, read while it streams in; `_Refused` for a status other than
    200 and beyond `max_bytes` (before any more of it is read)."""
    async with client.stream("GET", url, headers=headers, params=params) as response:
        if response.status_code != 200:
            raise _Refused("peer_unavailable", f"HTTP {response.status_code}")
        declared = response.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared[:20]) > max_bytes:
            raise _Refused("too_large", f"{declared[:20]} bytes > {max_bytes}")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise _Refused("too_large", f"over {max_bytes} bytes")
        return bytes(body)


def _rejected(metrics: BootstrapMetrics, peer: str, reason: str, detail: str) -> int:
    metrics.rejected.labels(reason).inc()
    detail = " ".join(detail.split())[:200]  # one line, whatever the peer sent
    logger.warning("bootstrap: cost model from %s refused (%s: %s); starting from the prior",
                   peer, reason, detail)  # fmt: skip
    return 0
