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
import logging

import httpx

from gateway.persistence.metrics import BootstrapMetrics
from gateway.persistence.snapshots import PEER, SnapshotRestorer
from gateway.routing import CostModel
from gateway.routing.cost_state import MAX_EXPORT_BYTES, CostStateError, parse_export
from indexer import SnapshotError, decode_snapshot

logger = logging.getLogger(__name__)

BOOTSTRAP_TIMEOUT_S = 30.0


class _TooLarge(Exception):
    pass


async def bootstrap_from_peer(
    client: httpx.AsyncClient,
    peer: str,
    token: str | None,
    restorer: SnapshotRestorer,
    *,
    max_bytes: int,
) -> int:
    """Load the peer's snapshot of every pod it subscribes to; returns how many loaded.
    Never fails start-up: an unreachable peer is logged and counted."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        async with asyncio.timeout(BOOTSTRAP_TIMEOUT_S):
            response = await client.get(f"{peer}/admin/pods", headers=headers)
            response.raise_for_status()
            names = [
                pod["name"]
                for pod in response.json()["pods"]
                if isinstance(pod, dict) and pod.get("subscriber") is not None
            ]
            loaded = 0
            for name in names:
                if await _load_one(client, peer, headers, name, restorer, max_bytes):
                    loaded += 1
    except (httpx.HTTPError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        restorer.ignore("peer_unavailable", f"from {peer} ({type(exc).__name__}: {exc})")
        return 0
    logger.info("bootstrap: %d of %d pods' snapshots taken from %s", loaded, len(names), peer)
    return loaded


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
        async with client.stream("GET", url, params={"pod": name}, headers=headers) as response:
            if response.status_code != 200:
                restorer.ignore("peer_unavailable", f"of pod {name}: HTTP {response.status_code}")
                return False
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise _TooLarge
                chunks.append(chunk)
    except _TooLarge:
        restorer.ignore("too_large", f"of pod {name} from {peer}")
        return False
    try:
        snapshot = await asyncio.to_thread(decode_snapshot, b"".join(chunks), max_bytes=max_bytes)
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
    cost: CostModel,
    metrics: BootstrapMetrics,
) -> int:
    """Start `cost` from the peer's learned models; returns how many were taken. Never
    fails start-up: an unreachable peer, or an answer too large, malformed or out of range
    (`cost_state.py`), is counted and logged in one line, nothing of it taken."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        async with asyncio.timeout(BOOTSTRAP_TIMEOUT_S):
            data = await _read_capped(client, f"{peer}/admin/cost-model", headers)
        taken = cost.adopt(await asyncio.to_thread(parse_export, data))
    except CostStateError as exc:
        return _rejected(metrics, peer, exc.reason, exc.detail)
    except (httpx.HTTPError, TimeoutError) as exc:
        return _rejected(metrics, peer, "peer_unavailable", f"{type(exc).__name__}: {exc}")
    logger.info("bootstrap: %d cost models taken from %s", taken, peer)
    return taken


async def _read_capped(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> bytes:
    """The answer's body, read while it streams in; CostStateError beyond the cap (before
    any more of it is read)."""
    async with client.stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            raise CostStateError("peer_unavailable", f"HTTP {response.status_code}")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_EXPORT_BYTES:
            raise CostStateError("too_large", f"{declared} bytes > {MAX_EXPORT_BYTES}")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_EXPORT_BYTES:
                raise CostStateError("too_large", f"over {MAX_EXPORT_BYTES} bytes")
        return bytes(body)


def _rejected(metrics: BootstrapMetrics, peer: str, reason: str, detail: str) -> int:
    metrics.rejected.labels(reason).inc()
    detail = " ".join(detail.split())[:200]  # one line, whatever the peer sent
    logger.warning("bootstrap: cost model from %s refused (%s: %s); starting from the prior",
                   peer, reason, detail)  # fmt: skip
    return 0
