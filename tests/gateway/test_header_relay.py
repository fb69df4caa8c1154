"""What crosses the gateway in headers: hop-by-hop fields are never relayed (RFC 9110
§7.6.1, both ways), an engine cannot set the gateway's own x-kvgate-* headers, W3C trace
context crosses both ways, the request id is the gateway's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http.server import GatewayServer
from gateway.settings import Settings
from tests.gateway.conftest import MODEL, StartGateway
from tests.helpers import eventually

EVIL_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
    b"connection: keep-alive, x-hop\r\nx-hop: engine-private\r\n"
    b"proxy-authenticate: Basic realm=engine\r\nproxy-connection: keep-alive\r\n"
    b"x-kvgate-pod: forged\r\nx-kvgate-cached-blocks: 999\r\nx-engine-ok: kept\r\n\r\n{}"
)


class Engine:
    """A raw HTTP engine: /metrics answers empty, everything else the evil answer; every
    request's head is kept."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.answer = EVIL_ANSWER
        self.later: bytes | None = None
        """Written `gap_s` after the answer, when set (then the connection is closed)."""
        self.gap_s = 0.05

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if head.startswith(b"GET /metrics"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                elif head.startswith(b"POST /tokenize"):
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                else:
                    self.heads.append(head)
                    writer.write(self.answer)
                    if self.later is not None:
                        await writer.drain()
                        await asyncio.sleep(self.gap_s)
                        writer.write(self.later)
                        await writer.drain()
                        return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def relayed(self) -> list[bytes]:
        """The heads of the requests relayed to it (the gateway also asks every pod for
        its `/v1/models`)."""
        return [head for head in self.heads if head.startswith(b"POST ")]

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    engine = Engine()
    engine.server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    yield engine
    engine.server.close()
    await engine.server.wait_closed()


async def test_hop_by_hop_and_forged_headers_are_not_relayed(
    start_gateway: StartGateway, engine: Engine
) -> None:
    gw = await start_gateway(engines=0, pods=[{"name": "raw", "url": engine.url, "model": MODEL}])
    async with gw.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={
                "connection": "keep-alive, authorization",
                "authorization": "Bearer k",
                "x-request-id": "r1",
            },
        )
    assert response.status_code == 200
    headers = response.headers
    for name in ("x-hop", "proxy-authenticate", "proxy-connection"):
        assert name not in headers, name
    assert headers.get_list("x-kvgate-pod") == ["raw"]  # the gateway's own, once
    assert headers["x-kvgate-cached-blocks"] == "0"
    assert headers["x-engine-ok"] == "kept"
    (head,) = engine.relayed
    assert b"authorization" not in head.lower()  # named by the client's Connection header
    assert b"x-request-id: r1" in head


TRACED_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
    b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01\r\n"
    b"tracestate: engine=1\r\nbaggage: tenant=acme\r\nx-request-id: engine-own\r\n\r\n{}"
)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_trace_context_crosses_both_ways_and_the_request_id_is_ours(
    start_gateway: StartGateway, engine: Engine
) -> None:
    engine.answer = TRACED_ANSWER
    gw = await start_gateway(engines=0, pods=[{"name": "raw", "url": engine.url, "model": MODEL}])
    async with gw.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={
                "traceparent": TRACEPARENT,
                "tracestate": "client=7",
                "baggage": "user=42",
                "x-request-id": "client-7",
            },
        )
    assert response.status_code == 200
    (head,) = engine.relayed
    lines = head.lower().split(b"\r\n")
    assert f"traceparent: {TRACEPARENT}".encode() in lines
    assert b"tracestate: client=7" in lines
    assert b"baggage: user=42" in lines
    assert lines.count(b"x-request-id: client-7") == 1
    headers = response.headers
    assert headers["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
    assert headers["tracestate"] == "engine=1"
    assert headers["baggage"] == "tenant=acme"
    assert headers.get_list("x-request-id") == ["client-7"]  # the engine's own is replaced


CHAT = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}]}' % MODEL.encode()


async def raw_post(port: int, body: bytes) -> tuple[bytes, bytes]:
    """The first read of the gateway's answer, and everything until the connection closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        async with asyncio.timeout(10):
            first = await reader.read(65536)
            rest = await reader.read()
        return first, first + rest
    finally:
        writer.close()


async def test_a_whole_answer_written_in_two_parts_is_relayed_in_one(
    start_gateway: StartGateway, engine: Engine
) -> None:
    """An engine (uvicorn, as vLLM's) writes a JSON answer's head and body apart; the
    gateway holds the head until the body is there, so the client gets both at once."""
    engine.answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
    )
    engine.later = b'{"ok": true}'[:11]
    gw = await start_gateway(engines=0, pods=[{"name": "raw", "url": engine.url, "model": MODEL}])
    first, whole = await raw_post(gw.server.port, CHAT)
    assert first.startswith(b"HTTP/1.1 200 ")
    assert first.endswith(b"\r\n\r\n" + engine.later)  # head and body in the first read
    assert whole == first


async def test_a_whole_answer_cut_before_its_body_is_a_head_then_a_cut(
    start_gateway: StartGateway, engine: Engine
) -> None:
    """The engine dies after its head: the client gets the head (as the engine sent it),
    then the connection closes before the declared length, as it would from the engine."""
    engine.answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n"
    )
    engine.later = b'{"partial'
    gw = await start_gateway(engines=0, pods=[{"name": "raw", "url": engine.url, "model": MODEL}])
    _, whole = await raw_post(gw.server.port, CHAT)
    head, _, body = whole.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"content-length: 50" in head.lower()
    assert len(body) < 50


async def test_a_forced_shutdown_while_a_whole_answer_is_held_sends_its_head_then_cuts(
    engine: Engine, tmp_path: Path
) -> None:
    """The gateway stops with a request whose head it holds for the body: past the drain
    timeout its task is cancelled, and the client sees the head, then the cut (what it saw
    when the head went out at once), never a 500 of the gateway's own."""
    engine.answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n"
    )
    engine.later, engine.gap_s = b"{}", 30.0
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [{"name": "raw", "url": engine.url, "model": MODEL}]}))
    app = create_app(Settings(pods_file=pods), metrics_registry=CollectorRegistry())
    server = GatewayServer(app, drain_timeout_s=1)
    await server.start()
    try:
        answer = asyncio.ensure_future(raw_post(server.port, CHAT))
        await eventually(lambda: len(engine.relayed) == 1)
    finally:
        await server.stop()
    _, whole = await answer
    assert whole.startswith(b"HTTP/1.1 200 ")
    assert b"content-length: 50" in whole.lower()
