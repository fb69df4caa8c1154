"""The proxy's HTTP/1.1 pool against real loopback servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import uvloop

from gateway.upstream.http1 import ConnectFailed, Http1Pool, ResponseBroken, ResponseTimeout
from tests.helpers import eventually, free_port

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
Handler = Callable[[Reader, Writer, "Server"], Awaitable[None]]


@dataclass
class Server:
    """A raw TCP server: each connection runs `handler`; connections are counted."""

    handler: Handler
    connections: int = 0
    closed_by_peer: int = 0
    server: asyncio.Server | None = None
    writers: list[Writer] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: Reader, writer: Writer) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(handler: Handler) -> Server:
        server = Server(handler)
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.server is not None
        server.server.close()
        for writer in server.writers:
            writer.close()
        await server.server.wait_closed()


@pytest.fixture
async def pool() -> AsyncIterator[Http1Pool]:
    pool = Http1Pool(connect_timeout_s=2.0, read_timeout_s=0.5)
    yield pool
    await pool.aclose()


async def keep_alive_ok(reader: Reader, writer: Writer, _: Server) -> None:
    while True:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()


async def test_a_connection_is_kept_alive_and_reused(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    server = await serve(keep_alive_ok)
    for _ in range(5):
        assert await pool.post(f"{server.url}/x", b"{}") == (200, b"ok")
    assert server.connections == 1


def test_the_pool_works_on_uvloop_too() -> None:
    """uvloop calls connection_made later than asyncio does, and its transports are not
    asyncio.Transport subclasses: the gateway runs on it in production."""

    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: keep_alive_ok(r, w, Server(keep_alive_ok)), "127.0.0.1", 0
        )
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = Http1Pool(connect_timeout_s=2.0, read_timeout_s=2.0)
        try:
            assert await pool.post(f"{url}/x", b"{}") == (200, b"ok")
            assert await pool.post(f"{url}/x", b"{}") == (200, b"ok")
            assert pool.open_connections == 1
        finally:
            await pool.aclose()
            server.close()
            await server.wait_closed()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def test_a_kept_connection_the_engine_dropped_is_replaced_transparently(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    async def one_answer_then_drop(reader: Reader, writer: Writer, server: Server) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await read_request(reader)  # the second request on this connection: dropped unanswered
        server.closed_by_peer += 1

    server = await serve(one_answer_then_drop)
    assert await pool.post(f"{server.url}/x", b"{}") == (200, b"ok")
    assert await pool.post(f"{server.url}/x", b"{}") == (200, b"ok")
    assert (server.connections, server.closed_by_peer) == (2, 1)


async def test_a_fresh_connection_closed_unanswered_is_a_connect_failure(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    async def drop(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)

    server = await serve(drop)
    with pytest.raises(ConnectFailed):
        await pool.post(f"{server.url}/x", b"{}")
    assert server.connections == 1  # not retried: the caller decides where to go next


async def test_nobody_listening_is_a_connect_failure(pool: Http1Pool) -> None:
    with pytest.raises(ConnectFailed, match="cannot connect"):
        await pool.post(f"http://127.0.0.1:{free_port()}/x", b"{}")


async def test_a_body_delimited_by_the_end_of_the_connection(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    async def old_style(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nall of it")
        await writer.drain()

    server = await serve(old_style)
    assert await pool.post(f"{server.url}/x", b"{}") == (200, b"all of it")
    assert pool.open_connections == 0  # not reusable


async def test_garbage_instead_of_http_is_a_broken_response(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    async def garbage(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    server = await serve(garbage)
    with pytest.raises(ResponseBroken, match="invalid HTTP"):
        await pool.post(f"{server.url}/x", b"{}")


async def test_a_body_cut_short_is_a_broken_response(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    async def short(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await writer.drain()

    server = await serve(short)
    exchange = await pool.send(server.url, b"POST /x HTTP/1.1\r\ncontent-length: 0\r\n", b"")
    with pytest.raises(ResponseBroken, match="middle of the answer"):
        await exchange.read()
    exchange.release()
    assert pool.open_connections == 0


async def test_silence_before_and_during_the_answer_times_out(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    async def silent(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async def stalls(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    with pytest.raises(ResponseTimeout):
        await pool.post(f"{(await serve(silent)).url}/x", b"{}")
    exchange = await pool.send(
        (await serve(stalls)).url, b"POST /x HTTP/1.1\r\ncontent-length: 0\r\n", b""
    )
    chunks = []
    with pytest.raises(ResponseTimeout):
        async for chunk in exchange.chunks():
            chunks.append(chunk)
    assert chunks == [b"abc"]
    exchange.release()


async def test_the_read_timeout_counts_each_wait_not_the_whole_answer(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    """Chunks 0.2 s apart for longer than the 0.5 s read timeout are not a timeout (the one
    timer per exchange fires during a later wait and checks again at its due time); the
    silence after them is."""

    async def trickles_then_stalls(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _chunk in range(6):
            await asyncio.sleep(0.2)
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
        await asyncio.sleep(5)

    exchange = await pool.send(
        (await serve(trickles_then_stalls)).url, b"POST /x HTTP/1.1\r\ncontent-length: 0\r\n", b""
    )
    loop = asyncio.get_running_loop()
    chunks = []
    with pytest.raises(ResponseTimeout):
        async for chunk in exchange.chunks():
            chunks.append((chunk, loop.time()))
    timed_out_at = loop.time()
    exchange.release()
    assert [chunk for chunk, _ in chunks] == [b"x"] * 6
    assert 0.45 <= timed_out_at - chunks[-1][1] < 2.0  # the stall, timed from its own start


async def test_abort_closes_the_connection_so_the_engine_sees_the_client_leave(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    peer_saw_close = asyncio.Event()

    async def streams(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        if await reader.read(1) == b"":
            peer_saw_close.set()

    server = await serve(streams)
    exchange = await pool.send(server.url, b"POST /x HTTP/1.1\r\ncontent-length: 0\r\n", b"")
    exchange.abort("client left")
    await asyncio.wait_for(peer_saw_close.wait(), 5)
    await eventually(lambda: pool.open_connections == 0, what="the connection forgotten")


async def test_endless_response_headers_are_a_broken_response(
    serve: Callable[[Handler], Awaitable[Server]], pool: Http1Pool
) -> None:
    async def endless(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(100_000):  # stops when the pool closes the connection
            writer.write(b"x-filler-%d: %s\r\n" % (i, b"y" * 200))
            await writer.drain()

    server = await serve(endless)
    with pytest.raises(ResponseBroken, match="exceed"):
        await pool.post(f"{server.url}/x", b"{}")
    await eventually(lambda: pool.open_connections == 0, what="the connection closed")


async def test_trickled_response_headers_hit_the_header_deadline(
    serve: Callable[[Handler], Awaitable[Server]],
) -> None:
    async def trickle(reader: Reader, writer: Writer, _: Server) -> None:
        await read_request(reader)
        for byte in b"HTTP/1.1 200 OK\r\nx-slow: " + b"z" * 1000:
            writer.write(bytes([byte]))  # each byte well within the read timeout
            await writer.drain()
            await asyncio.sleep(0.01)

    pool = Http1Pool(connect_timeout_s=2.0, read_timeout_s=5.0, header_deadline_s=0.5)
    server = await serve(trickle)
    try:
        with pytest.raises(ResponseBroken, match=r"took more than 0\.5 s"):
            await pool.post(f"{server.url}/x", b"{}")
    finally:
        await pool.aclose()
