"""Gateway replicas that route as one: each publishes its routing decisions, the others
fold them into their own view.

What makes routing good under load is per replica: the router-side expected entries that
make a burst with a new prefix stick to one pod, and each pod's outstanding prefill in the
cost model. With N independent replicas each sees 1/N of it (the rest arrives late, through
engine events and the once-a-second scrape). So every replica publishes, on its own ZMQ
PUB socket (`KVGATE_REPLICA_SYNC_BIND`), one small message per decision (pod, context,
prefix hashes, uncached tokens), per first byte and per end of exchange, plus a heartbeat;
and subscribes to every peer (`KVGATE_REPLICA_PEERS`, `KVGATE_REPLICA_PEER_SERVICE`). The
messages of one event-loop turn leave as one frame (`wire.py`): one encode and one send
per burst instead of one per message. A peer's decision adds its expected entries to the
local index and its prefill to the pod's queue in the cost model (as a remote ticket: load
only, nothing learned), until that peer reports its first byte and end.

No broker: a lost message costs one decision's accuracy; a lost peer (no heartbeat for
`peer_timeout_s`) has its tickets dropped, so its load never lingers, and routing carries
on as independent replicas do — sending never blocks (PUB drops at its high-water mark).

Trust: with CURVE keys (`keys.py`) only holders of a trusted key pair can read or feed the
channel, encrypted; a replica bound beyond loopback refuses to start without them
(`Settings`). What even a trusted peer can do is bounded (`bounds.py`): frames, rates,
contexts, index room, tokens, requests per pod, and their lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from typing import Any

import zmq
import zmq.asyncio

from gateway.control.replication import wire
from gateway.control.replication.bounds import PEER_TICKET_TTL_S, Fleet, PeerBounds
from gateway.control.replication.guard import ChannelGuard
from gateway.control.replication.keys import CurveKeys
from gateway.control.replication.peers import PeerView, TokenBucket
from gateway.control.replication.receiver import PeerReceiver
from gateway.errors import ConfigError
from indexer import ModelContext, SyncPrefixHashTable
from predictor import Predictor, Ticket

logger = logging.getLogger(__name__)

RECEIVE_HWM = 256
"""Frames queued per peer connection at most (≤ 64 MiB at `MAX_MESSAGE_BYTES`): beyond it
ZMQ stops reading that connection, so a flood is bounded in memory."""
SEND_HWM = 1_000
"""Frames queued per subscriber at most; beyond it frames are dropped (counted)."""
RECEIVE_BYTES_PER_S = 8 * 1024 * 1024
"""Frames decoded a second at most, from all peers together (beyond: dropped undecoded,
`rate_limited`): decoding costs ~20 ms of CPU per MiB, so a flood costs at most ~15 % of
a core. A busy peer sends well under 1 MiB/s."""
DRAIN_SLICE_S = 0.01
"""Frames are applied for at most this long before the event loop serves others."""


class ReplicaSync:
    """One replica's side of the decision sharing; owned by the lifespan (`start`, `run`,
    `close`), fed by the router (`decided`, `answered`, `finished`)."""

    def __init__(
        self,
        *,
        bind: str,
        peers: Sequence[str],
        table: SyncPrefixHashTable,
        cost: Predictor,
        fleet: Fleet,
        keys: CurveKeys | None = None,
        peer_service: str | None = None,
        heartbeat_s: float = 1.0,
        peer_timeout_s: float = 3.0,
        ticket_ttl_s: float = PEER_TICKET_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bind_endpoint = bind
        self.peer_endpoints = tuple(peers)
        self.peer_service = peer_service
        self._resolved: set[str] = set()
        """Endpoints connected because the peer service resolved to them."""
        self.cost = cost
        """The cost model the peers' requests are queued in (as remote tickets)."""
        self._keys = keys
        self._heartbeat_s = heartbeat_s
        self._clock = clock
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._receiver = PeerReceiver(
            replica=self.replica,
            table=table,
            cost=cost,
            bounds=PeerBounds(fleet, table),
            max_peers=lambda: 4 * max(1, len(self.peer_endpoints) + len(self._resolved)),
            peer_timeout_s=peer_timeout_s,
            ticket_ttl_s=ticket_ttl_s,
            clock=clock,
        )
        self.rejected = self._receiver.rejected
        """Received messages (or refused connections) ignored, by reason."""
        self.sent: Counter[str] = Counter()
        self.cpu_s = 0.0
        """This thread's CPU spent encoding, sending, receiving and applying messages."""
        self._outbox: list[list[Any]] = []
        self._outbox_bytes = 0
        """What the queued messages will weigh packed, at most."""
        self.dropped = 0
        """Messages not sent (the PUB's high-water mark: a slow peer)."""
        self._received_bytes = TokenBucket(RECEIVE_BYTES_PER_S, RECEIVE_BYTES_PER_S, clock)
        self._pub_context = zmq.asyncio.Context()
        self._sub_context = zmq.asyncio.Context()
        self._guard: ChannelGuard | None = None
        self._pub_socket: zmq.asyncio.Socket | None = None
        # The PUB is sent to from plain router code: the blocking API's shadow of the
        # socket, whose NOBLOCK send fails at once (the asyncio one hands back a future).
        self._pub: zmq.Socket[bytes] | None = None
        self._subs: list[zmq.asyncio.Socket] = []
        """One per trusted server key (one without keys): each connects to every peer."""

    @property
    def peers(self) -> dict[str, PeerView]:
        return self._receiver.peers

    @property
    def received(self) -> Counter[str]:
        return self._receiver.received

    @property
    def losses(self) -> int:
        """Times a peer fell silent with requests in flight."""
        return self._receiver.losses

    @property
    def expired(self) -> int:
        """Peer requests dropped for age while their peer was live."""
        return self._receiver.expired

    def receive(self, frame: bytes) -> None:
        """Apply one peer frame (`PeerReceiver.receive`)."""
        self._receiver.receive(frame)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the PUB and connect to every peer (a bad endpoint fails start-up)."""
        keys = self._keys
        pub = self._pub_context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, SEND_HWM)
        if keys is not None:
            self._guard = ChannelGuard(self._pub_context, keys, self.rejected)
            self._guard.secure(pub)
        try:
            pub.bind(self.bind_endpoint)
        except zmq.ZMQError as exc:
            pub.close(linger=0)
            raise ConfigError(
                "KVGATE_REPLICA_SYNC_BIND", self.bind_endpoint, f"a free local endpoint ({exc})"
            ) from None
        self.bind_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._pub_socket = pub
        self._pub = zmq.Socket.shadow(pub.underlying)
        for server_key in keys.trusted if keys is not None else [None]:
            sub = self._sub_context.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
            sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5_000)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            if keys is not None and server_key is not None:
                sub.setsockopt(zmq.CURVE_SECRETKEY, keys.secret.encode("ascii"))
                sub.setsockopt(zmq.CURVE_PUBLICKEY, keys.public.encode("ascii"))
                sub.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode("ascii"))
            for endpoint in self.peer_endpoints:
                sub.connect(endpoint)
            self._subs.append(sub)

    async def run(self) -> None:
        """Receive the peers' messages, answer the PUB's ZAP requests, send heartbeats,
        drop what lost peers left."""
        if self._pub is None:
            raise RuntimeError("ReplicaSync.run before start")
        poller = zmq.asyncio.Poller()
        guarded = self._guard.poll_sockets() if self._guard is not None else []
        for sock in [*self._subs, *guarded]:
            poller.register(sock, zmq.POLLIN)
        next_beat = next_lookup = self._clock()
        while True:
            now = self._clock()
            if now >= next_beat:
                self._send(["h"])
                self._receiver.expire(now)
                next_beat = now + self._heartbeat_s
            if self.peer_service is not None and now >= next_lookup:
                await self._follow_peer_service()
                next_lookup = now + 5 * self._heartbeat_s
            wait_ms = max(0, round((next_beat - self._clock()) * 1000))
            for sock, _ in await poller.poll(timeout=wait_ms):
                if self._guard is not None and sock in guarded:
                    await self._guard.handle(sock)
                elif not self._drain(sock):
                    await asyncio.sleep(0)  # more queued: let the requests run first

    def _drain(self, sub: zmq.asyncio.Socket) -> bool:
        """Apply the frames already queued, without a trip through the event loop each
        (the sync shadow of the same socket: a NOBLOCK receive fails at once when empty),
        for at most `DRAIN_SLICE_S`; returns whether the queue was emptied."""
        shadow: zmq.Socket[bytes] = zmq.Socket.shadow(sub.underlying)
        budget = self._received_bytes
        with self._timed():
            deadline = time.perf_counter() + DRAIN_SLICE_S
            while time.perf_counter() < deadline:
                try:
                    frame = shadow.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return True
                if budget.take(len(frame)):
                    self.receive(frame)
                else:
                    self.rejected["rate_limited"] += 1
            return False

    @contextlib.contextmanager
    def _timed(self) -> Generator[None, None, None]:
        started = time.thread_time()
        try:
            yield
        finally:
            self.cpu_s += time.thread_time() - started

    async def _follow_peer_service(self) -> None:
        """Connect to every address the peer service resolves to, and only those (our own
        address included: our own messages are recognised and skipped)."""
        assert self.peer_service is not None
        host, _, port = self.peer_service.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except OSError as exc:  # DNS down or no replica ready: keep the current peers
            self.rejected["peer_lookup_failed"] += 1
            logger.debug("replica sync: %s did not resolve: %s", self.peer_service, exc)
            return
        wanted = {
            f"tcp://[{info[4][0]}]:{port}"
            if ":" in str(info[4][0])
            else f"tcp://{info[4][0]}:{port}"
            for info in infos
        }
        for sub in self._subs:
            for endpoint in sorted(wanted - self._resolved):
                sub.connect(endpoint)
            for endpoint in sorted(self._resolved - wanted):
                with contextlib.suppress(zmq.ZMQError):
                    sub.disconnect(endpoint)
        self._resolved = wanted

    def close(self) -> None:
        self.flush()
        for sock in [*self._subs, self._pub_socket]:
            if sock is not None:
                sock.close(linger=0)
        if self._guard is not None:
            self._guard.close()
        self._pub = self._pub_socket = None
        self._subs = []
        self._pub_context.term()
        self._sub_context.term()

    # -- publishing (the router, on the event loop: never blocks) -------------------------

    def decided(self, ticket: Ticket, context: ModelContext, hashes: Sequence[int]) -> None:
        shared = list(hashes[: wire.MAX_HASHES])
        own = ticket.prediction.own_tokens
        body = ["d", ticket.number, ticket.pod, context.model, context.lora, shared, own]
        self._send(body, packed_bytes=64 + 9 * len(shared))  # a hash packs in ≤ 9 bytes

    def answered(self, ticket: Ticket) -> None:
        self._send(["b", ticket.number])

    def finished(self, ticket: Ticket) -> None:
        self._send(["f", ticket.number])

    def _send(self, body: list[Any], packed_bytes: int = 16) -> None:
        """Queue one message (`packed_bytes`: at most its packed size); the turn's messages
        leave together once the loop is free."""
        if self._pub is None:
            return
        # A frame stays well under the peers' MAXMSGSIZE (a larger one costs the connection).
        if self._outbox and (
            self._outbox_bytes + packed_bytes > wire.MAX_MESSAGE_BYTES // 2
            or len(self._outbox) >= wire.MAX_MESSAGES_PER_FRAME
        ):
            self.flush()
        outbox = self._outbox
        outbox.append(body)
        self._outbox_bytes += packed_bytes
        if len(outbox) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a direct call): send at once
                self.flush()

    def flush(self) -> None:
        """Send the queued messages as one frame (dropped whole at the high-water mark)."""
        pub, outbox = self._pub, self._outbox
        if not outbox:
            return
        self._outbox, self._outbox_bytes = [], 0
        if pub is None:
            return
        with self._timed():
            payload = wire.encode(self.replica, outbox)
            try:
                pub.send(payload, flags=zmq.NOBLOCK)
            except zmq.Again:
                self.dropped += len(outbox)
                return
            self.sent.update(body[0] for body in outbox)

    def view(self) -> dict[str, Any]:
        """For /admin/pods: this replica, its peers and the channel's counters."""
        now = self._clock()
        keys = self._keys
        return {
            "replica": self.replica,
            "bind": self.bind_endpoint,
            "curve": None if keys is None else {"public_key": keys.public,
                                                 "trusted_keys": len(keys.trusted)},
            "peer_endpoints": list(self.peer_endpoints) + sorted(self._resolved),
            "peer_service": self.peer_service,
            "peers": self._receiver.peers_json(now),
            "sent": dict(self.sent),
            "dropped": self.dropped,
            "rejected": dict(self.rejected),
        }  # fmt: skip

    def live_peers(self) -> int:
        return self._receiver.live_peers(self._clock())
