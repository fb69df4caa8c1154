"""Fixtures: a real gateway (uvicorn on loopback) in front of real simulated engines."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

import simulator.tokenizer
from gateway.app import create_app
from gateway.http.server import GatewayServer
from gateway.settings import Settings
from simulator import EngineServer
from tests.conftest import StartEngine

ADMIN_TOKEN = "test-admin-token"
MODEL = "sim-model"
SIM_TOKENIZER = Path(simulator.tokenizer.__file__).parent
"""The simulated model's tokenizer files (what a gateway loads to tokenize in-process)."""


def pod_entry(server: EngineServer, *, events: bool = True, **extra: Any) -> dict[str, Any]:
    engine = server.engine
    entry: dict[str, Any] = {"name": engine.config.name, "url": server.url, "model": MODEL}
    if events:
        entry.update(
            events=engine.publisher.events_endpoint,
            replay=engine.publisher.replay_endpoint,
            topic=engine.config.topic,
        )
    entry.update(extra)
    return entry


@dataclass
class Gateway:
    server: GatewayServer
    app: Any
    pods_file: Path
    engines: list[EngineServer]

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def state(self) -> Any:
        return self.app.state.gateway

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=30, **kwargs)

    def admin(self) -> httpx.AsyncClient:
        return self.client(headers={"authorization": f"Bearer {ADMIN_TOKEN}"})

    def write_pods(self, entries: list[dict[str, Any]]) -> None:
        self.pods_file.write_text(json.dumps({"pods": entries}))


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def start_gateway(start_engine: StartEngine, tmp_path: Path) -> AsyncIterator[StartGateway]:
    """Start `engines` simulated engines and a gateway in front of them."""
    gateways: list[GatewayServer] = []

    async def start(
        engines: int = 2,
        *,
        engine_overrides: dict[str, Any] | None = None,
        pods: list[dict[str, Any]] | None = None,
        **settings_overrides: Any,
    ) -> Gateway:
        servers = [
            await start_engine(name=f"e{i}", **(engine_overrides or {})) for i in range(engines)
        ]
        if (engine_overrides or {}).get("flavor") == "sglang":
            # SGLang's /tokenize takes no chat messages: as deployed, the gateway tokenizes
            # chats in-process with the model's files, or (`tokenizer="remote"`) asks a
            # vLLM tokenizer of the same model (AIBRIX_REMOTE_TOKENIZER_ENDPOINT).
            if settings_overrides.get("tokenizer") == "remote":
                settings_overrides.setdefault("tokenizer_endpoint", await _chat_tokenizer())
            else:
                settings_overrides.setdefault("tokenizers", {MODEL: SIM_TOKENIZER})
        pods_file = tmp_path / "pods.json"
        entries = pods if pods is not None else [pod_entry(server) for server in servers]
        pods_file.write_text(json.dumps({"pods": entries}))
        settings = replace(
            Settings(pods_file=pods_file, admin_token=ADMIN_TOKEN, scrape_interval_s=0.2),
            **settings_overrides,
        )
        app = create_app(settings, metrics_registry=CollectorRegistry())
        server = GatewayServer(app)
        await server.start()
        gateways.append(server)
        return Gateway(server, app, pods_file, servers)

    async def _chat_tokenizer() -> str:
        """A vLLM tokenizer of the model (here a vLLM-flavoured simulator, same tokenizer
        and template)."""
        return (await start_engine(name="tokenizer")).url

    yield start
    for server in reversed(gateways):
        await server.stop()
