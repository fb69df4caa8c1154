"""Security properties of a real gateway: the admin token, where the gateway connects, and
whose events a pod can change."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx

from gateway.settings import Settings
from subscriber import BlockRemoved, BlockStored, KVEventBatch, encode_batch
from tests.conftest import StartEngine
from tests.gateway.conftest import ADMIN_TOKEN, MODEL, Gateway, StartGateway, pod_entry
from tests.helpers import eventually, kvgate_serve
from tests.reliability.test_http_fuzz import assert_openai_error

ADMIN_PATHS = (("GET", "/admin/pods"), ("GET", "/admin/index?pod=e0"), ("POST", "/admin/match"))
MATCH_BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


async def test_admin_needs_the_exact_bearer_token_and_says_nothing_more(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(1)
    wrong = [
        {},
        {"authorization": ADMIN_TOKEN},
        {"authorization": f"Basic {ADMIN_TOKEN}"},
        {"authorization": f"Bearer {ADMIN_TOKEN}x"},
        {"authorization": f"Bearer {ADMIN_TOKEN[:-1]}"},
        {"authorization": "Bearer"},
        {"authorization": b"Bearer \xff\xfe" + ADMIN_TOKEN.encode()},  # non-ASCII
        {"authorization": b"Bearer " + ADMIN_TOKEN.encode() + b"\xe9"},
    ]
    async with gw.client() as client:
        for method, path in ADMIN_PATHS:
            bodies = set()
            for headers in wrong:
                response = await client.request(method, path, headers=headers, json=MATCH_BODY)
                assert response.status_code == 401, (path, headers, response.text)
                assert_openai_error(response)
                bodies.add(response.content)
            assert len(bodies) == 1, "a 401 must not tell which check failed"
            ok = await client.request(
                method, path, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, json=MATCH_BODY
            )
            assert ok.status_code == 200, ok.text


async def test_admin_is_disabled_without_a_configured_token(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, admin_token=None)
    async with gw.client() as client:
        for method, path in ADMIN_PATHS:
            for headers in ({}, {"authorization": "Bearer"}, {"authorization": "Bearer None"}):
                response = await client.request(method, path, headers=headers, json=MATCH_BODY)
                assert response.status_code == 404
                assert_openai_error(response)


async def test_the_admin_token_never_appears_in_logs_or_metrics(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    """`kvgate serve` at debug level: requests with the token, wrong tokens and the token in
    other headers; neither its output nor /metrics nor /admin/pods ever shows the token."""
    token = "tok-" + os.urandom(12).hex()
    engine = await start_engine(name="e0")
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [pod_entry(engine)]}))
    log = tmp_path / "gateway.log"
    env = {**os.environ, "KVGATE_ADMIN_TOKEN": token, "KVGATE_SCRAPE_INTERVAL": "0.2"}
    pages: list[str] = []
    async with kvgate_serve(pods, log, env, "--log-level", "debug") as client:
        good = {"authorization": f"Bearer {token}"}
        for headers in (good, {"authorization": f"Bearer {token[:-1]}"},
                        {"authorization": f"Bearer {token}{token}"},
                        {"authorization": token}, {"x-session-id": token}):  # fmt: skip
            for method, path in ADMIN_PATHS:
                await client.request(method, path, headers=headers, json=MATCH_BODY)
        await client.post("/v1/chat/completions", json={**MATCH_BODY, "max_tokens": 2})
        await client.post("/v1/chat/completions", content=b"{bad", headers=good)
        pages.append((await client.get("/metrics")).text)
        pages.append((await client.get("/admin/pods", headers=good)).text)
    output = log.read_text(errors="replace")
    assert "DEBUG" in output, "debug logging was not on: the check would prove nothing"
    for text in (output, *pages):
        assert token not in text
        assert token[:16] not in text


class Trap:
    """A listening socket no request may ever make the gateway contact."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        async def on_connect(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self._server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


async def test_no_request_makes_the_gateway_contact_an_address_it_did_not_discover(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(1)
    trap = Trap()
    await trap.start()
    url = f"http://127.0.0.1:{trap.port}"
    host = f"127.0.0.1:{trap.port}"
    hostile_headers = {
        "host": host,
        "x-forwarded-host": host,
        "x-forwarded-for": "127.0.0.1",
        "forwarded": f"host={host}",
        "x-kvgate-pod": url,
        "x-kvgate-policy": url,
        "x-session-id": url,
        "x-request-id": url,
        "x-original-url": url,
        "x-rewrite-url": url,
        "referer": url,
        "origin": url,
    }
    bodies = [
        {"model": url, "messages": [{"role": "user", "content": "hi"}]},
        {"model": f"{url}/v1", "prompt": "hi"},
        {"model": MODEL, "prompt": url, "max_tokens": 2, "base_url": url, "api_base": url},
        {"model": MODEL, "messages": [{"role": "user", "content": url}], "url": url,
         "max_tokens": 2, "tokenizer": url, "endpoint": url},
    ]  # fmt: skip
    served_by: set[str] = set()
    try:
        async with gw.admin() as client:
            for body in bodies:
                for path in ("/v1/chat/completions", "/v1/completions", "/admin/match"):
                    for headers in (hostile_headers, {"x-kvgate-pod": url}, {"host": host}):
                        response = await client.post(path, json=body, headers=headers)
                        assert response.status_code < 500, response.text
                        if "x-kvgate-pod" in response.headers:
                            served_by.add(response.headers["x-kvgate-pod"])
            for path in (f"/admin/index?pod={url}", f"/admin/index?pod={host}", "/admin/pods"):
                response = await client.get(path, headers=hostile_headers)
                assert response.status_code in (200, 404)
        # an absolute-form request target naming the trap
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.server.port)
        payload = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
        writer.write(
            f"POST {url}/v1/completions HTTP/1.1\r\nhost: {host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
            "connection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 "), answer[:100]
        await asyncio.sleep(0.3)  # a connection the gateway started would have arrived by now
    finally:
        await trap.stop()
    assert trap.connections == 0
    assert served_by <= {"e0"}
    assert served_by, "no request was served: the check would prove nothing"


async def index_of(gw: Gateway, pod: str) -> dict[str, list[object]]:
    async with gw.admin() as client:
        response = await client.get(f"/admin/index?pod={pod}")
    assert response.status_code == 200, response.text
    hashes: dict[str, list[object]] = response.json()["engine_hashes"]
    return hashes


async def test_events_are_attributed_by_the_socket_they_arrive_on(
    start_gateway: StartGateway,
) -> None:
    """Pod A's publisher sends batches made to look like pod B's (same topic, B's data
    parallel rank, B's block hashes): they change A's index only."""
    gw = await start_gateway(2)
    a, b = gw.engines
    assert a.engine.config.topic == b.engine.config.topic  # nothing but the socket differs
    async with httpx.AsyncClient(base_url=b.url, timeout=10) as direct:
        response = await direct.post(
            "/v1/completions", json={"model": MODEL, "prompt": "pod b holds this " * 8,
                                     "max_tokens": 2},
        )  # fmt: skip
        assert response.status_code == 200

    async def b_indexed() -> bool:
        return bool((await index_of(gw, "e1"))["GPU"])

    await eventually(b_indexed, what="pod B's blocks in the index")
    b_before = await index_of(gw, "e1")
    b_hashes = tuple(b_before["GPU"])
    size = a.engine.config.block_size
    forged = [10**15 + i for i in range(3)]
    claims = [
        KVEventBatch(
            ts=time.time(),
            events=(BlockStored(tuple(forged), None, tuple(range(3 * size)), size),),
            data_parallel_rank=1,
        ),
        KVEventBatch(ts=time.time(), events=(BlockRemoved(b_hashes),), data_parallel_rank=1),
    ]
    for batch in claims:
        await a.engine.publisher.publish(encode_batch(batch))

    async def a_has_forged() -> bool:
        return set(forged) <= set((await index_of(gw, "e0"))["GPU"])

    await eventually(a_has_forged, what="the forged blocks indexed under pod A")
    assert await index_of(gw, "e1") == b_before
    assert not set(forged) & set((await index_of(gw, "e1"))["GPU"])


def test_settings_never_show_the_admin_token() -> None:
    loaded = Settings.load({"KVGATE_ADMIN_TOKEN": "s3cr3t-token"})
    assert loaded.admin_token == "s3cr3t-token"
    assert "s3cr3t-token" not in repr(loaded) and "s3cr3t-token" not in str(loaded)


async def test_no_answer_sends_the_client_elsewhere_by_its_host_header(
    start_gateway: StartGateway,
) -> None:
    """A path with a trailing slash (or any path not served) is a 404 in OpenAI's shape:
    never a redirect whose Location is built from the client's Host header."""
    gw = await start_gateway(1)
    host = {"host": "evil.example"}
    async with gw.client(follow_redirects=False) as client:
        for method, path in (
            ("POST", "/v1/embeddings/"),
            ("POST", "/v1/chat/completions/"),
            ("POST", "/v1/completions/"),
            ("GET", "/v1/models/"),
            ("GET", "/health/"),
            ("GET", "/metrics/"),
            ("GET", "/admin/pods/"),
            ("POST", "/tokenize/"),
        ):
            response = await client.request(method, path, headers=host, json=MATCH_BODY)
            assert response.status_code == 404, (path, response.status_code)
            assert_openai_error(response)
            assert "location" not in response.headers, path
            assert "evil.example" not in response.text
        # the paths without the slash are served
        embed = {"model": MODEL, "input": "hi"}
        response = await client.post("/v1/embeddings", headers=host, json=embed)
        assert response.status_code == 200, response.text
