"""Receiving from a ZMQ socket on the event loop without pyzmq's asyncio layer.

pyzmq's asyncio socket makes a future per `recv_multipart`, registers and drops interest
in the socket's events around it and re-checks them on every wake-up: about two thirds of
the Python time per live KV event batch (one batch per request with distinct prompts).
Here the socket's file descriptor stays registered for the reader's lifetime and each
wait is one bare future: `recv_multipart` first asks whether a message is queued, and
only when none is waits for the descriptor to signal.

ZMQ's descriptor is edge-like: it signals that the socket's state may have changed, and
is reset by the library whenever it processes its commands (asking for the socket's
events does). So the reader never waits while a message is queued (it asks first), and a
message arriving after it asked signals the descriptor again.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import zmq

_MAX_PARTS = 16
"""Parts of one message kept (vLLM sends 3; beyond, the rest is read and dropped, and the
message, one part too long, is refused by the frame check)."""


class SocketReader:
    """Multipart messages from `socket`, awaited; `close()` before the socket closes."""

    def __init__(self, socket: zmq.Socket[Any]) -> None:
        self._socket: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)
        fd = self._socket.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._loop.add_reader(self._fd, self._signalled)

    def _signalled(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def recv_multipart(self) -> list[bytes]:
        socket = self._socket
        while not self._readable():
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        # The parts of a message arrive together: once the first is there, all are. (Not
        # pyzmq's `recv_multipart`: it builds a flag enum per call, and a receive that finds
        # nothing raises zmq.Again, whose construction costs more than a receive.)
        parts = [socket.recv(zmq.NOBLOCK)]
        while socket.get(zmq.RCVMORE):
            part = socket.recv(zmq.NOBLOCK)
            if len(parts) <= _MAX_PARTS:  # a publisher's part count is not ours to hold
                parts.append(part)
        return parts

    def _readable(self) -> bool:
        """A message is queued (asking also resets the descriptor's signal)."""
        return bool(cast(int, self._socket.get(zmq.EVENTS)) & zmq.POLLIN)

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
