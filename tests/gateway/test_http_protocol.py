"""`HeadWithBody` over a real socket: a response's head goes out with its body's first
bytes in one write when they come in the same event-loop iteration, alone at the end of
the iteration otherwise, and before the connection closes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from gateway.http_protocol import HeadWithBody


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


@pytest.fixture
async def pair() -> AsyncIterator[tuple[RecordedTransport, socket.socket]]:
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, sock=ours)
    recorded = RecordedTransport(transport)
    try:
        yield recorded, peer
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


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


async def test_the_head_and_a_body_written_in_the_same_iteration_are_one_write(
    pair: tuple[RecordedTransport, socket.socket],
) -> None:
    recorded, peer = pair
    writer = HeadWithBody(recorded, asyncio.get_running_loop())
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
    pair: tuple[RecordedTransport, socket.socket],
) -> None:
    recorded, peer = pair
    writer = HeadWithBody(recorded, asyncio.get_running_loop())
    writer.write(HEAD)
    await asyncio.sleep(0)  # a stream's first chunk is not there yet
    assert recorded.writes == [HEAD]
    assert await read_exactly(peer, len(HEAD)) == HEAD
    writer.write(b"hello")
    assert recorded.writes == [HEAD, b"hello"]


async def test_closing_writes_a_held_head_first(
    pair: tuple[RecordedTransport, socket.socket],
) -> None:
    recorded, peer = pair
    writer = HeadWithBody(recorded, asyncio.get_running_loop())
    writer.write(HEAD)
    writer.close()
    assert writer.is_closing()
    assert recorded.writes == [HEAD]
    assert await read_exactly(peer, len(HEAD) + 1) == HEAD  # then the end of the stream
    await asyncio.sleep(0)
    assert recorded.writes == [HEAD]  # the end of the iteration writes nothing more
