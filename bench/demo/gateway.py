"""The gateway in the demo process: its pods file, start-up on a port, and the admin calls
the demo waits on (every subscriber whole, every pod's index empty after a cache reset)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.demo.fleet import EngineEndpoint, port_is_free
from gateway.app import create_app
from gateway.server import GatewayServer
from gateway.settings import Settings


def write_pods_file(
    path: Path, endpoints: Sequence[EngineEndpoint], topic: str = "kv-events"
) -> Path:
    pods = [
        {"name": e.name, "url": e.url, "model": e.model, "events": e.events,
         "replay": e.replay, "topic": topic}
        for e in endpoints
    ]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pods": pods}, indent=2) + "\n")
    return path


def choose_port(preferred: int) -> int:
    """`preferred` when it is free (0: any free port), else 0 (any free port)."""
    if preferred and port_is_free(preferred):
        return preferred
    return 0


async def start_gateway(pods_file: Path, admin_token: str, port: int) -> GatewayServer:
    settings = Settings(pods_file=pods_file, admin_token=admin_token, drain_timeout_s=2.0)
    server = GatewayServer(create_app(settings), port=choose_port(port), drain_timeout_s=2)
    await server.start()
    return server


class AdminClient:
    """The gateway's admin API and the engines' cache reset, over one HTTP client."""

    def __init__(self, client: httpx.AsyncClient, gateway_url: str, token: str) -> None:
        self._client = client
        self._url = gateway_url
        self._headers = {"authorization": f"Bearer {token}"}

    async def pods(self) -> list[dict[str, Any]]:
        response = await self._client.get(f"{self._url}/admin/pods", headers=self._headers)
        response.raise_for_status()
        pods: list[dict[str, Any]] = response.json()["pods"]
        return pods

    async def wait_whole(self, *, empty: bool = False, timeout_s: float = 30.0) -> None:
        """Until every pod is healthy and its subscriber live and whole (and, with `empty`,
        its index holds no block)."""
        last: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        last = await self.pods()
                        if last and all(_settled(pod, empty) for pod in last):
                            return
                    await asyncio.sleep(0.05)
        except TimeoutError as exc:
            states = {p["name"]: (p.get("subscriber"), p.get("index_blocks")) for p in last}
            raise TimeoutError(f"subscribers not whole after {timeout_s} s: {states}") from exc

    async def reset_engine_caches(
        self, engine_urls: Sequence[str], *, timeout_s: float = 30.0
    ) -> None:
        """`POST /reset_prefix_cache` on every engine (retried while one is still busy)."""
        async with asyncio.timeout(timeout_s):
            for url in engine_urls:
                while True:
                    response = await self._client.post(f"{url}/reset_prefix_cache")
                    if response.status_code == 200:
                        break
                    if response.status_code != 400:
                        response.raise_for_status()
                    await asyncio.sleep(0.1)  # 400: requests still running there


def _settled(pod: dict[str, Any], empty: bool) -> bool:
    subscriber = pod.get("subscriber") or {}
    whole = bool(pod.get("healthy")) and subscriber.get("phase") == "live"
    whole = whole and bool(subscriber.get("whole"))
    return whole and (not empty or pod.get("index_blocks", 0) == 0)
