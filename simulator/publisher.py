"""KV-event PUB socket and ROUTER replay socket, exactly as vLLM 0.32 speaks them.

PUB message: `[topic, seq (8-byte big-endian, from 0 per publisher start), payload]`.
Replay: a DEALER sends `[b"", start_seq (8 bytes BE)]`; for every buffered batch with
seq >= start the ROUTER answers `[b"", topic, seq, payload]`, then the end marker
`[b"", b"", ff×8, b""]`. The buffer keeps the last `buffer_size` batches: an older start
silently gets the buffer from its oldest entry, a start past the newest only the end marker.
Every batch enters the replay buffer even when a fault drops it from the PUB socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Literal

import zmq
import zmq.asyncio

logger = logging.getLogger(__name__)

END_SEQ = b"\xff" * 8
EventsMode = Literal["bind", "connect", "auto"]


def bindable(endpoint: str) -> str:
    """ZMQ's spelling of an ephemeral port: `tcp://host:0` → `tcp://host:*`."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


def should_bind(endpoint: str, mode: EventsMode) -> bool:
    """vLLM's rule for `auto`: bind when the endpoint has `*` or is ipc://, else connect."""
    if mode == "auto":
        return "*" in endpoint or endpoint.startswith("ipc://")
    return mode == "bind"


class EventPublisher:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        *,
        events_endpoint: str,
        replay_endpoint: str | None,
        topic: str = "kv-events",
        mode: EventsMode = "bind",
        buffer_size: int = 10_000,
    ) -> None:
        if buffer_size < 1:
            raise ValueError(f"replay buffer must hold >= 1 batch, got {buffer_size}")
        self._ctx = ctx
        self._events_config = events_endpoint
        self._replay_config = replay_endpoint
        self._mode = mode
        self.topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_size)
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._subscriptions_task: asyncio.Task[None] | None = None
        self.subscriptions = 0
        """SUBSCRIBE messages received on the events socket (any topic, every subscriber):
        a client can wait for its subscription to arrive instead of sleeping."""
        self.next_seq = 0
        self.events_endpoint = events_endpoint
        self.replay_endpoint = replay_endpoint
        self.sent_batches = 0
        self.dropped_batches = 0
        self.replay_requests = 0

    async def start(self) -> None:
        """Open both sockets (retrying a recently released port briefly) and serve replays."""
        self.next_seq = 0
        self._buffer.clear()
        # XPUB: a PUB on the wire (any SUB takes it) that also hands us each SUBSCRIBE.
        pub = self._ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's SUBSCRIBE, not only the first
        self._pub = pub
        self._subscriptions_task = asyncio.create_task(
            self._count_subscriptions(pub), name="subscriptions"
        )
        if should_bind(self._events_config, self._mode):
            await _bind(pub, bindable(self._events_config))
            self.events_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            pub.connect(self._events_config)
        if self._replay_config:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            self._router = router
            await _bind(router, bindable(self._replay_config))
            self.replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._replay_task = asyncio.create_task(self._serve_replay(router), name="replay")

    async def stop(self) -> None:
        for task in (self._replay_task, self._subscriptions_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._replay_task = self._subscriptions_task = None
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None

    async def restart(self) -> None:
        """Like an engine process restart: fresh sockets on the same endpoints (even when the
        first start picked ephemeral ports), seq from 0, empty replay buffer."""
        await self.stop()
        self._events_config = self.events_endpoint
        self._replay_config = self.replay_endpoint
        await self.start()

    async def publish(self, payload: bytes, *, drop: bool = False, forget: bool = False) -> int:
        """Buffer one batch for replay and send it on the PUB socket (unless `drop`).

        `forget` first empties the replay buffer, as if it had overrun: it then holds this
        batch only (a real buffer always holds the newest batches)."""
        seq = self.next_seq
        self.next_seq += 1
        if forget:
            self._buffer.clear()
        self._buffer.append((seq, payload))
        if drop or self._pub is None:
            self.dropped_batches += 1
            return seq
        await self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        self.sent_batches += 1
        return seq

    async def _count_subscriptions(self, pub: zmq.asyncio.Socket) -> None:
        while True:
            message = await pub.recv()
            if message[:1] == b"\x01":
                self.subscriptions += 1

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("ignoring malformed replay request with %d frames", len(frames))
                continue
            identity, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            self.replay_requests += 1
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await router.send_multipart(
                        [identity, b"", self.topic, seq.to_bytes(8, "big"), payload]
                    )
            await router.send_multipart([identity, b"", b"", END_SEQ, b""])


async def _bind(sock: zmq.asyncio.Socket, endpoint: str, attempts: int = 50) -> None:
    for attempt in range(attempts):
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or attempt == attempts - 1:
                raise
            await asyncio.sleep(0.05)
