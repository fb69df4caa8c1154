"""kvgate's HTTP server protocol: `HeadWithBody` over a real socket (a response's head goes
out with its body's first bytes in one write when they come in the same event-loop
iteration, alone at the end of the iteration otherwise, and before the connection closes),
and the `BODY_RECEIVED` extension on a real server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from starlette.types import Receive, Scope, Send

from gateway.http.protocol import BODY_RECEIVED, HeadWithBody
from gateway.http.server import GatewayServer


class RecordedTransport:
    """asyncio's own transport, with the writes it was given recorded."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def close(self) -> None:
        self.transport.close()


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


@dataclass
class Held:
    """A `HeadWithBody` over a real socket pair."""

    writer: HeadWithBody
    recorded: RecordedTransport
    peer: socket.socket


@pytest.fixture
async def held() -> AsyncIterator[Held]:
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    recorded = RecordedTransport(transport)
    writer = HeadWithBody(recorded, loop)
    try:
        yield Held(writer, recorded, peer)
    finally:
        transport.close()
        peer.close()


async def read_exactly(peer: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(5):
        while len(data) < size:
            more = await loop.sock_recv(peer, size - len(data))
            if not more:
                break
            data += more
    return data


async def test_the_head_and_a_body_written_in_the_same_iteration_are_one_write(
    held: Held,
) -> None:
    writer, recorded, peer = held.writer, held.recorded, held.peer
    writer.write(HEAD)
    assert recorded.writes == []
    writer.write(b"hello")
    assert recorded.writes == [HEAD + b"hello"]
    writer.write(b"later")  # once the head is out, writes pass straight through
    assert recorded.writes == [HEAD + b"hello", b"later"]
    assert await read_exactly(peer, len(HEAD) + 10) == HEAD + b"hellolater"
    await asyncio.sleep(0)
    assert len(recorded.writes) == 2  # nothing held, nothing written twice


async def test_a_head_without_a_body_goes_out_at_the_end_of_the_iteration(
    held: Held,
) -> None:
    writer, recorded, peer = held.writer, held.recorded, held.peer
    writer.write(HEAD)
    await asyncio.sleep(0)  # a stream's first chunk is not there yet
    assert recorded.writes == [HEAD]
    assert await read_exactly(peer, len(HEAD)) == HEAD
    writer.write(b"hello")
    assert recorded.writes == [HEAD, b"hello"]


async def test_closing_writes_a_held_head_first(held: Held) -> None:
    writer, recorded, peer = held.writer, held.recorded, held.peer
    writer.write(HEAD)
    writer.close()
    assert writer.is_closing()
    assert recorded.writes == [HEAD]
    assert await read_exactly(peer, len(HEAD) + 1) == HEAD  # then the end of the stream
    await asyncio.sleep(0)
    assert recorded.writes == [HEAD]  # the end of the iteration writes nothing more


async def seen_body_received(scope: Scope, receive: Receive, send: Send) -> None:
    """An app that answers whether the server said the body was whole when it started."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    flag = scope["extensions"].get(BODY_RECEIVED, False)
    while (await receive()).get("more_body", False):
        pass
    answer = b"yes" if flag else b"no"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"%d" % len(answer))]})  # fmt: skip
    await send({"type": "http.response.body", "body": answer})


async def test_the_server_says_when_the_body_is_already_whole() -> None:
    server = GatewayServer(seen_body_received)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\n"
        writer.write(head + b"body")  # the body with its head: read without a deadline
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(3) == b"yes"
            writer.write(head + b"bo")  # on the same connection, half a body: it is not
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"dy")
            await reader.readuntil(b"\r\n\r\n")
            assert await reader.readexactly(2) == b"no"
        writer.close()
    finally:
        await server.stop()


async def answers_without_reading(scope: Scope, receive: Receive, send: Send) -> None:
    """An app that answers at once, reading no body (as a 401 does)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-length", b"2")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"no"})


async def test_an_answer_before_the_body_keeps_the_connection_for_the_next_request() -> None:
    """The answer went out before the body was whole, saying keep-alive: the rest of the
    body is read and dropped and the client's next request on the connection is served;
    a client still trickling that body after the linger is cut off."""
    server = GatewayServer(answers_without_reading)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\n"
        async with asyncio.timeout(10):
            writer.write(head + b"bo")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 401")
            assert await reader.readexactly(2) == b"no"
            writer.write(b"dy" + head + b"body")  # the rest, then the next request at once
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 401")
            assert await reader.readexactly(2) == b"no"
            writer.write(head + b"b")  # and one whose body never ends
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 401")
            assert await reader.readexactly(2) == b"no"
            assert await reader.read() == b""  # closed after the linger, not held
        writer.close()
    finally:
        await server.stop()
