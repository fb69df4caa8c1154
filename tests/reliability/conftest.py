"""Fixtures of the reliability tests: the gateway fixtures, and a gateway whose uvicorn
server bounds are set by the test."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http.server import GatewayServer
from gateway.settings import Settings
from tests.conftest import StartEngine
from tests.gateway.conftest import ADMIN_TOKEN, Gateway, pod_entry, start_gateway

__all__ = ["ServeGateway", "serve_gateway", "start_gateway"]

ServeGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def serve_gateway(start_engine: StartEngine, tmp_path: Path) -> AsyncIterator[ServeGateway]:
    """Like `start_gateway`, with the uvicorn server's bounds (`server`) and a pods list
    (`pods`, from the started engines by default) given by the test."""
    servers: list[GatewayServer] = []

    async def start(
        engines: int = 1,
        *,
        server: dict[str, Any] | None = None,
        pods: list[dict[str, Any]] | None = None,
        **settings_overrides: Any,
    ) -> Gateway:
        engine_servers = [await start_engine(name=f"e{i}") for i in range(engines)]
        pods_file = tmp_path / "pods.json"
        entries = pods if pods is not None else [pod_entry(s) for s in engine_servers]
        pods_file.write_text(json.dumps({"pods": entries}))
        settings = replace(
            Settings(pods_file=pods_file, admin_token=ADMIN_TOKEN, scrape_interval_s=0.2),
            **settings_overrides,
        )
        app = create_app(settings, metrics_registry=CollectorRegistry())
        gateway_server = GatewayServer(app, **(server or {}))
        await gateway_server.start()
        servers.append(gateway_server)
        return Gateway(gateway_server, app, pods_file, engine_servers)

    yield start
    for gateway_server in reversed(servers):
        await gateway_server.stop()
