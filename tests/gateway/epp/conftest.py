"""Fixtures: `kvgate epp`'s app (the gateway and its gRPC picker on loopback) in front of
real simulated engines, and an Envoy-side client to it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.epp.client import Answer, EnvoyClient, EnvoyStream, request_pick
from gateway.epp.protocol import BodyMode
from gateway.epp.server import EppConfig, EppService
from gateway.http.server import GatewayServer
from gateway.settings import Settings
from simulator import EngineServer
from tests.conftest import StartEngine
from tests.gateway.conftest import ADMIN_TOKEN, MODEL, pod_entry

CHAT = "/v1/chat/completions"


def chat(user: str, *, system: str = "You are a helpful assistant. " * 8, **extra: Any) -> bytes:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4, **extra}).encode()


@dataclass
class Picker:
    server: GatewayServer
    app: Any
    service: EppService
    envoy: EnvoyClient
    engines: list[EngineServer]
    pods_file: Path

    @property
    def state(self) -> Any:
        return self.app.state.gateway

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.service.port}"

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.server.url, timeout=30)

    def endpoints(self) -> dict[str, str]:
        """Engine name by its ip:port."""
        return {s.url.removeprefix("http://"): s.engine.config.name for s in self.engines}

    def write_pods(self, entries: list[dict[str, Any]]) -> None:
        self.pods_file.write_text(json.dumps({"pods": entries}))

    async def metric(self, sample: str) -> float:
        async with self.http() as client:
            page = (await client.get("/metrics")).text
        for line in page.splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{sample} not on the page")


StartPicker = Callable[..., Awaitable[Picker]]


@pytest.fixture
async def start_picker(start_engine: StartEngine, tmp_path: Path) -> AsyncIterator[StartPicker]:
    started: list[Picker] = []

    async def start(
        engines: int = 2,
        *,
        config: EppConfig | None = None,
        engine_overrides: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> Picker:
        servers = [
            await start_engine(name=f"e{i}", **(engine_overrides or {})) for i in range(engines)
        ]
        pods_file = tmp_path / "pods.json"
        pods_file.write_text(json.dumps({"pods": [pod_entry(s) for s in servers]}))
        settings = replace(
            Settings(pods_file=pods_file, admin_token=ADMIN_TOKEN, scrape_interval_s=0.2),
            **overrides,
        )
        service = EppService(config or EppConfig(host="127.0.0.1", port=0))
        app = create_app(settings, metrics_registry=CollectorRegistry(), attach=service.start)
        server = GatewayServer(app)
        await server.start()
        picker = Picker(server, app, service, EnvoyClient(f"127.0.0.1:{service.port}"), servers,
                        pods_file)  # fmt: skip
        started.append(picker)
        return picker

    yield start
    for picker in reversed(started):
        await picker.envoy.close()
        await picker.server.stop()


@dataclass
class Exchange:
    endpoint: str
    request_answers: list[Answer]
    response_answers: list[Answer]
    answer: bytes
    """What the engine answered, as the data plane relayed it."""


async def exchange(
    picker: Picker,
    body: bytes,
    *,
    mode: BodyMode = "FULL_DUPLEX_STREAMED",
    headers: dict[str, str] | None = None,
    chunks: int = 1,
    body_first: bool = False,
    subset: list[str] | str | None = None,
    stream: EnvoyStream | None = None,
) -> Exchange:
    """One request through the picker as Envoy runs it: the request side, then the request
    sent to the endpoint the picker chose, its answer passed through the stream."""
    stream = stream or picker.envoy.stream()
    answers = await request_pick(stream, CHAT, body, headers=headers, mode=mode, chunks=chunks,
                                 subset=subset, body_first=body_first)  # fmt: skip
    named = [a.destination for a in answers if a.destination]
    assert len(named) == 1, answers
    endpoint = named[0]
    relayed: list[Answer] = []
    parts: list[bytes] = []
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", f"http://{endpoint}{CHAT}", content=body,
                      headers={"content-type": "application/json"}) as response,
    ):  # fmt: skip
        await stream.response_headers(response.status_code, served=endpoint)
        relayed.append(await _read(stream))
        if mode == "BUFFERED":
            parts.append(await response.aread())
            await stream.response_body(parts[0], end_of_stream=True)
            relayed.append(await _read(stream))
        else:
            async for part in response.aiter_raw():
                parts.append(part)
                await stream.response_body(part, end_of_stream=False)
                relayed.append(await _read(stream))
            await stream.response_body(b"", end_of_stream=True)
            relayed.append(await _read(stream))
    await stream.done_writing()
    assert await stream.read() is None
    return Exchange(endpoint, answers, relayed, b"".join(parts))


async def _read(stream: EnvoyStream) -> Answer:
    answer = await stream.read()
    assert answer is not None
    return answer
