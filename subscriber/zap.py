"""Who may publish into an event socket the gateway binds: ZMQ's ZAP hook, by address.

With `events_bind`, the gateway binds the pod's event endpoint and the engine connects to
it — and so could any other process that reaches the port, publishing forged blocks for
that pod. Each bound SUB socket gets the ZAP domain of its pod; this handler (ZAP's REP
socket on the manager's ZMQ context) accepts a connection only from one of the pod's own
addresses (its URL's host), refuses any other and counts it per pod. An `ipc://` endpoint
carries no address: file permissions are its control.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import zmq
import zmq.asyncio

logger = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
DOMAIN_PREFIX = "kvgate-pod:"


def domain_of(pod: str) -> bytes:
    return (DOMAIN_PREFIX + pod).encode()


class ZapGuard:
    """Accepts a ZMQ peer into a pod's bound event socket only from the pod's addresses."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        self._context = context
        self._allowed: dict[str, frozenset[str]] = {}
        self.refused: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._socket: zmq.asyncio.Socket | None = None

    def allow(self, pod: str, addresses: Iterable[str]) -> None:
        self._allowed[pod] = frozenset(addresses)
        if self._task is None:  # only a gateway that binds event sockets runs a handler
            socket = self._context.socket(zmq.REP)
            socket.setsockopt(zmq.LINGER, 0)
            socket.bind(ZAP_ENDPOINT)
            self._socket = socket
            self._task = asyncio.create_task(self._serve(socket), name="kv-events-zap")

    def forget(self, pod: str) -> None:
        self._allowed.pop(pod, None)
        self.refused.pop(pod, None)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    async def _serve(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            await socket.send_multipart(self.decide(frames))

    def decide(self, frames: list[bytes]) -> list[bytes]:
        """A ZAP reply to a ZAP request (RFC 27): 200 for a pod's own address, else 400."""
        if len(frames) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, domain, address = frames[0], frames[1], frames[2], frames[3]
        pod = domain.decode(errors="replace").removeprefix(DOMAIN_PREFIX)
        peer = address.decode(errors="replace")
        allowed = self._allowed.get(pod)
        if allowed is None or peer in allowed:
            return [version, request_id, b"200", b"OK", b"", b""]
        self.refused[pod] = self.refused.get(pod, 0) + 1
        if self.refused[pod] == 1 or self.refused[pod] % 100 == 0:
            logger.warning("kv events of %s: refused a publisher from %s (the pod is at %s); "
                           "%d refused so far", pod, peer, ", ".join(sorted(allowed)),
                           self.refused[pod])  # fmt: skip
        return [version, request_id, b"400", b"not this pod's address", b"", b""]
