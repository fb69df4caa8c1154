"""The gateway's limits on a real server: body size and time, header size and time,
concurrent requests, prompt tokens."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path

import httpx
import pytest

from gateway.http.limits import ConcurrencyLimit
from tests.gateway.conftest import MODEL
from tests.helpers import eventually
from tests.reliability.conftest import ServeGateway
from tests.reliability.test_http_fuzz import assert_openai_error

BOUNDS = {"max_header_bytes": 8 * 1024, "header_timeout_s": 0.5}


def chat_body(text: str = "hello") -> bytes:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    ).encode()


async def open_partial_request(
    port: int, path: str, body: bytes, sent: int, headers: dict[str, str] | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request whose headers announce `body` but of which only `sent` bytes go out."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode()
    writer.write(head + body[:sent])
    await writer.drain()
    return reader, writer


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    return int(status_line.split()[1]), headers, body


async def test_a_body_sent_too_slowly_gets_408(serve_gateway: ServeGateway) -> None:
    gw = await serve_gateway(body_timeout_s=0.5, server=BOUNDS)
    reader, writer = await open_partial_request(
        gw.server.port, "/v1/chat/completions", chat_body(), sent=10
    )
    try:
        status, _, body = await read_response(reader)
    finally:
        writer.close()
    assert status == 408
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


async def test_a_client_trickling_after_its_408_is_disconnected(
    serve_gateway: ServeGateway,
) -> None:
    """After its 408 a client that goes on sending its body cannot hold the connection:
    the answer says `Connection: close`, the server shuts its side at once and stops
    reading within seconds (the connection used to stay open for as long as the client
    trickled, > 95 s)."""
    gw = await serve_gateway(body_timeout_s=0.5, server=BOUNDS)
    long_body = chat_body("x" * 10_000)  # minutes of trickling
    reader, writer = await open_partial_request(
        gw.server.port, "/v1/chat/completions", long_body, sent=10
    )
    try:
        status, headers, _ = await read_response(reader)
        assert status == 408 and headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the server's side is shut
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            async with asyncio.timeout(10):  # a bound: the server lingers 2 s
                while True:  # the client goes on trickling
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.sleep(0.05)
    finally:
        writer.close()
    assert _rejected(gw, "RequestTimeout") == 1.0


def _rejected(gw: object, reason: str) -> float | None:
    registry = gw.state.metrics.prometheus  # type: ignore[attr-defined]
    value: float | None = registry.get_sample_value(
        "kvgate_requests_rejected_total", {"reason": reason}
    )
    return value


async def test_headers_that_never_end_get_the_connection_closed(
    serve_gateway: ServeGateway,
) -> None:
    gw = await serve_gateway(server=BOUNDS)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", gw.server.port)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.server.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")
    await writer.drain()
    try:
        # the server closes both: EOF without a response
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert await asyncio.wait_for(idle_reader.read(), 10) == b""
    finally:
        writer.close()
        idle_writer.close()
    async with gw.client() as client:  # the server itself is fine
        assert (await client.get("/health")).status_code == 200


async def test_oversized_headers_get_431(serve_gateway: ServeGateway) -> None:
    gw = await serve_gateway(server=BOUNDS)
    async with gw.client() as client:
        one_big = await client.get("/health", headers={"x-big": "a" * 9000})
        many = await client.get("/health", headers={f"x-h{i}": "b" * 100 for i in range(100)})
        long_url = await client.get("/health?" + "q" * 9000)
        fine = await client.get("/health", headers={"x-ok": "a" * 4000})
    assert one_big.status_code == 431
    assert many.status_code == 431
    assert long_url.status_code == 431
    assert fine.status_code == 200


async def test_oversized_bodies_get_413_declared_or_chunked(serve_gateway: ServeGateway) -> None:
    gw = await serve_gateway(max_body_bytes=1024)
    big = chat_body("x" * 2000)

    async def chunks() -> object:
        for start in range(0, len(big), 100):
            yield big[start : start + 100]

    async with gw.client() as client:
        declared = await client.post("/v1/chat/completions", content=big)
        chunked = await client.post("/v1/chat/completions", content=chunks())
    for response in (declared, chunked):
        assert response.status_code == 413
        assert_openai_error(response)


async def test_requests_beyond_the_concurrency_limit_get_429_with_retry_after(
    serve_gateway: ServeGateway,
) -> None:
    gw = await serve_gateway(max_concurrent_requests=2, body_timeout_s=30.0)
    body = chat_body()
    long_answer = json.dumps({"model": MODEL, "stream": True, "max_tokens": 400,
                              "messages": [{"role": "user", "content": "go on"}]})  # fmt: skip
    async with gw.client() as client, contextlib.AsyncExitStack() as streams:
        # two long streamed answers hold both slots until their last byte
        for _ in range(2):
            await streams.enter_async_context(
                client.stream("POST", "/v1/chat/completions", content=long_answer)
            )
        await eventually(lambda: _in_progress(gw) == 2, what="two requests in progress")
        refused = await client.post("/v1/chat/completions", content=body)
        admin_refused = await client.get("/admin/pods")
        health = await client.get("/health")
        metrics = await client.get("/metrics")
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert_openai_error(refused)
        assert admin_refused.status_code == 429
        assert health.status_code == 200 and metrics.status_code == 200
        assert 'kvgate_requests_rejected_total{reason="TooManyRequests"} 2.0' in metrics.text
    # the streams closed: their slots are free
    await eventually(lambda: _in_progress(gw) == 0, what="the slots freed")
    async with gw.client() as client:
        accepted = await client.post("/v1/chat/completions", content=body)
    assert accepted.status_code == 200


async def test_slow_bodies_hold_no_slot(serve_gateway: ServeGateway) -> None:
    """Trickling bodies used to take every slot until the body timeout: now a slot is taken
    when the body is complete, and each client address has its own bound on bodies still
    arriving after their grace."""
    gw = await serve_gateway(max_concurrent_requests=2, max_bodies_per_client=12,
                             body_timeout_s=30.0)  # fmt: skip
    port = gw.server.port
    path = "/v1/chat/completions"
    body = chat_body()
    limiter = limiter_of(gw)
    slow = [await open_partial_request(port, path, body, sent=5) for _ in range(12)]
    try:
        await eventually(lambda: limiter.slow.get("127.0.0.1") == 12, what="12 slow bodies")
        async with gw.client() as client:
            for _ in range(3):  # real requests still get through, one after the other
                answer = await client.post(path, content=body)
                assert answer.status_code == 200, answer.text
            assert limiter.in_progress == 0
        # from the same address, a body sent in two parts within its grace is served
        reader, writer = await open_partial_request(port, path, body, sent=5)
        writer.write(body[5:])
        await writer.drain()
        status, _, _ = await read_response(reader)
        writer.close()
        assert status == 200
        # a 13th body still arriving after its grace: 429, and its connection is closed
        reader, writer = await open_partial_request(port, path, body, sent=5)
        slow.append((reader, writer))
        status, headers, refused = await read_response(reader)
        assert status == 429 and headers["retry-after"] == "1"
        assert headers["connection"] == "close"
        assert b"KVGATE_MAX_BODIES_PER_CLIENT" in refused
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert limiter.slow["127.0.0.1"] == 12
        assert _rejected(gw, "TooManyRequests") == 1.0
        # a trickled body that completes is served like any other, and no longer counts
        reader, writer = slow[0]
        writer.write(body[5:])
        await writer.drain()
        status, _, _ = await read_response(reader)
        assert status == 200
        assert limiter.slow["127.0.0.1"] == 11
    finally:
        for _, writer in slow:
            writer.close()
    await eventually(lambda: not limiter.slow, what="the slow bodies gone with their clients")


BURST_CLIENT = Path(__file__).with_name("burst_client.py")


@pytest.mark.parametrize("requests", [100, 400])
async def test_a_burst_from_one_address_is_not_refused(
    serve_gateway: ServeGateway, requests: int
) -> None:
    """Behind an ingress every client shares one address. 100 or 400 requests at once from
    one address, from another process (each body read after its headers, in a later turn
    of the event loop), are all served: a body counted against its address from its
    headers on used to refuse 36 of 100 and 336 of 400 with 429."""
    gw = await serve_gateway()
    client = await asyncio.create_subprocess_exec(
        sys.executable, str(BURST_CLIENT), gw.url, str(requests), MODEL,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(client.communicate(), 180)
    finally:
        if client.returncode is None:
            client.kill()
            await client.wait()
    assert json.loads(out) == {"200": requests}
    assert _rejected(gw, "TooManyRequests") == 0.0
    assert limiter_of(gw).slow == {}


def limiter_of(gw: object) -> ConcurrencyLimit:
    """The app's limiter, found in its middleware stack."""
    node: object = gw.app  # type: ignore[attr-defined]
    while node is not None:
        if isinstance(node, ConcurrencyLimit):
            return node
        node = getattr(node, "middleware_stack", None) or getattr(node, "app", None)
    raise AssertionError("no ConcurrencyLimit in the middleware stack")


def _in_progress(gw: object) -> int:
    return limiter_of(gw).in_progress


async def test_prompts_over_the_token_limit_get_400(serve_gateway: ServeGateway) -> None:
    gw = await serve_gateway(max_prompt_tokens=40)
    async with gw.client() as client:
        short = await client.post("/v1/chat/completions", content=chat_body("hi"))
        long = await client.post("/v1/chat/completions", content=chat_body("word " * 200))
        ids = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": list(range(41)), "max_tokens": 1}
        )
        ids_ok = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": list(range(40)), "max_tokens": 1}
        )
    assert short.status_code == 200
    assert ids_ok.status_code == 200
    for response, param in ((long, "messages"), (ids, "prompt")):
        assert response.status_code == 400
        assert_openai_error(response)
        assert response.json()["error"]["param"] == param
        assert "x-kvgate-pod" not in response.headers


async def test_upstream_timeouts_exist(serve_gateway: ServeGateway) -> None:
    """A stalled engine: the client gets 504 after KVGATE_UPSTREAM_TIMEOUT, not a hang."""
    gw = await serve_gateway(upstream_timeout_s=0.5)
    engine = gw.engines[0]
    async with httpx.AsyncClient(base_url=engine.url) as direct:
        armed = await direct.post("/sim/faults", json={"stall_ms": 3000, "seconds": 10})
    assert armed.status_code == 200, armed.text
    async with gw.client() as client:
        response = await client.post("/v1/chat/completions", content=chat_body())
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "upstream_timeout"


async def test_a_client_leaving_mid_body_is_counted_not_an_error(
    serve_gateway: ServeGateway,
) -> None:
    gw = await serve_gateway()
    _, writer = await open_partial_request(
        gw.server.port, "/v1/chat/completions", chat_body(), sent=10
    )
    writer.close()
    registry = gw.state.metrics.prometheus

    def counted() -> bool:
        value = registry.get_sample_value(
            "kvgate_requests_rejected_total", {"reason": "ClientClosed"}
        )
        return value == 1.0

    await eventually(counted, what="the abandoned request counted as ClientClosed")
