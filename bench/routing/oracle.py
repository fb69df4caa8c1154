"""The oracle router: routes with full knowledge of every engine's cache, to bound what
any router can achieve. Its own process: `python -m bench.routing.oracle PODS PORT
[BLOCK_HASH]` (the engines' `--block-hash` scheme, default `sim`).

It subscribes to every engine's KV events (each engine is reset before a run, so the view
starts empty and complete), applies them to one set of resident blocks per engine, and
hashes each prompt exactly as the simulated engines do (the simulator's own tokenizer,
chat template and block hasher). A request goes to the engine holding the longest prefix
of it; among equals, to the one with the fewest requests in flight (then at random).
Nothing else: no load guard, which is why it bounds the hit rate, not the latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import uvicorn
import zmq
import zmq.asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.upstream.http1 import Http1Error, Http1Pool
from simulator.block_hash import BLOCK_HASHES, int_hash, to_unsigned64
from simulator.tokenizer import SimTokenizer
from simulator.wire import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch


@dataclass(slots=True)
class Engine:
    name: str
    url: str
    events: str
    blocks: set[int] = field(default_factory=set)
    inflight: int = 0
    batches: int = 0
    """Event batches received (any: a reset's AllBlocksCleared shows the subscription is live)."""

    def apply(self, payload: bytes) -> None:
        self.batches += 1
        for event in decode_batch(payload).events:
            if isinstance(event, BlockStored):
                self.blocks.update(_key(h) for h in event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.blocks.difference_update(_key(h) for h in event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.blocks.clear()

    def matched(self, keys: list[int]) -> int:
        count = 0
        for key in keys:
            if key not in self.blocks:
                break
            count += 1
        return count


def _key(value: int | bytes) -> int:
    return int.from_bytes(value[-8:], "big") if isinstance(value, bytes) else to_unsigned64(value)


class Oracle:
    def __init__(
        self,
        engines: list[Engine],
        block_size: int = 16,
        hash_seed: int = 0,
        block_hash: str = "sim",
    ) -> None:
        self.engines = engines
        self._tokenizer = SimTokenizer.load()
        self._hasher = BLOCK_HASHES[block_hash](block_size, hash_seed)
        self._rng = random.Random(0)

    def keys(self, body: dict[str, Any]) -> list[int]:
        tokens = self._tokenizer.encode_chat(body, completions=True)
        return [int_hash(digest) for digest in self._hasher.chain(tokens)]

    def pick(self, body: dict[str, Any], headers: Mapping[str, str]) -> Engine:
        keys = self.keys(body)
        order = list(self.engines)
        self._rng.shuffle(order)
        return max(order, key=lambda e: (e.matched(keys), -e.inflight))

    async def run(self, ready: asyncio.Event) -> None:
        context = zmq.asyncio.Context()
        try:
            await self.listen(context, ready)
        finally:
            context.term()

    async def listen(self, context: zmq.asyncio.Context, ready: asyncio.Event) -> None:
        sockets = {}
        poller = zmq.asyncio.Poller()
        for engine in self.engines:
            socket = context.socket(zmq.SUB)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(engine.events)
            poller.register(socket, zmq.POLLIN)
            sockets[socket] = engine
        ready.set()
        try:
            while True:
                for socket, _ in await poller.poll():
                    frames = await socket.recv_multipart()
                    sockets[socket].apply(frames[-1])
        finally:
            for socket in sockets:
                socket.close(linger=0)


class BaselineRouter(Protocol):
    """A benchmark-only router: which engine a request goes to, and what it runs meanwhile."""

    engines: list[Engine]

    def pick(self, body: dict[str, Any], headers: Mapping[str, str]) -> Engine: ...

    async def run(self, ready: asyncio.Event) -> None:
        """Runs for the app's life; sets `ready` once requests may come."""


def create_app(oracle: BaselineRouter) -> Starlette:
    """The router as an OpenAI chat endpoint that streams the chosen engine's answer.

    It relays through kvgate's own HTTP/1.1 pool (`gateway.upstream.http1`) with raw ASGI messages,
    as the gateway does: a baseline must not lose a comparison to its own relay (behind
    httpx's pool, whose cost grows with its connections, sticky-rr used 0.6 of a core and
    answered 500s at 280 closed-loop users while the engines idled)."""
    pool = Http1Pool(connect_timeout_s=5.0, read_timeout_s=600.0, max_idle_per_origin=1024)
    ready = asyncio.Event()

    async def chat(scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        raw = await request.body()
        body = json.loads(raw)
        engine = oracle.pick(body, request.headers)
        engine.inflight += 1
        head = b"POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\n"
        head += b"content-length: %d\r\n" % len(raw)
        try:
            exchange = await pool.send(engine.url, head, raw)
        except Http1Error as exc:
            engine.inflight -= 1
            await JSONResponse({"error": {"message": str(exc)}}, 502)(scope, receive, send)
            return
        headers = [(name, value) for name, value in exchange.headers if name == b"content-type"]
        headers.append((b"x-kvgate-pod", engine.name.encode()))
        try:
            start = {"type": "http.response.start", "status": exchange.status, "headers": headers}
            await send(start)
            async for chunk in exchange.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            exchange.release()
            engine.inflight -= 1

    async def health(_: Request) -> Response:
        return Response(status_code=200 if ready.is_set() else 503)

    async def state(_: Request) -> Response:
        return JSONResponse(
            {e.name: {"blocks": len(e.blocks), "inflight": e.inflight} for e in oracle.engines}
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        background = asyncio.create_task(oracle.run(ready), name="baseline-router")
        try:
            yield
        finally:
            background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await background
            await pool.aclose()

    routes = [
        Route("/v1/chat/completions", _Asgi(chat), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/router/state", state, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


class _Asgi:
    """An ASGI callable as a route's endpoint (starlette wraps a plain function as a
    request → response handler)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def serve(router: BaselineRouter, port: int) -> int:
    uvicorn.run(create_app(router), host="127.0.0.1", port=port, log_level="warning", loop="uvloop")
    return 0


def engines_of(pods_file: Path) -> list[Engine]:
    pods = json.loads(pods_file.read_text())["pods"]
    return [Engine(p["name"], p["url"], p["events"]) for p in pods]


def main(argv: list[str]) -> int:
    block_hash = argv[2] if len(argv) > 2 else "sim"
    if block_hash not in BLOCK_HASHES:
        print(f"oracle: unknown block hash scheme {block_hash!r}", file=sys.stderr)
        return 2
    return serve(Oracle(engines_of(Path(argv[0])), block_hash=block_hash), int(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
