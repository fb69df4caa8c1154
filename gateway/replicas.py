"""Gateway replicas that route as one: each publishes its routing decisions, the others
fold them into their own view.

What makes routing good under load is per replica: the router-side expected entries that
make a burst with a new prefix stick to one pod, and each pod's outstanding prefill in the
cost model. With N independent replicas each sees 1/N of it (the rest arrives late, through
engine events and the once-a-second scrape). So every replica publishes, on its own ZMQ
PUB socket (`KVGATE_REPLICA_SYNC_BIND`), one small message per decision (pod, context,
prefix hashes, uncached tokens), per first byte and per end of exchange, plus a heartbeat;
and subscribes to every peer (`KVGATE_REPLICA_PEERS`). The messages of one event-loop
turn leave as one frame (`[wire, version, replica, [message, ...]]`): one encode and one
send per burst instead of one per message. A peer's decision adds its expected
entries to the local index and its prefill to the pod's queue in the cost model (as a
remote ticket: load only, nothing learned), until that peer reports its first byte and end.

No broker: a lost message costs one decision's accuracy; a lost peer (no heartbeat for
`peer_timeout_s`) has its tickets dropped, so its load never lingers, and routing carries
on as independent replicas do — sending never blocks (PUB drops at its high-water mark).

Trust: a replica only consumes what it subscribed to, from the configured peers; every
message is bounded (size, hashes, tickets per peer) and checked field by field, and what
a peer can do is bounded: expected entries that expire, load that expires with the peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.errors import ConfigError
from gateway.routing.cost import CostModel, Ticket
from indexer import ModelContext, SyncPrefixHashTable, UnknownPodError

logger = logging.getLogger(__name__)

WIRE = "kvgate-sync"
VERSION = 2
"""2: a frame carries a list of messages (1 carried one). Replicas of another version are
ignored (counted as malformed): during a rolling upgrade they route as independent ones."""
MAX_MESSAGE_BYTES = 256 * 1024
MAX_MESSAGES_PER_FRAME = 1024
MAX_HASHES = 16_384
MAX_TICKETS_PER_PEER = 20_000


@dataclass(slots=True)
class PeerView:
    """What this replica knows of one peer (by the id it announces)."""

    replica: str
    last_heard: float = -math.inf
    tickets: dict[int, Ticket] = field(default_factory=dict)
    received: Counter[str] = field(default_factory=Counter)
    losses: int = 0

    def as_json(self, now: float, timeout_s: float) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "live": now - self.last_heard <= timeout_s,
            "last_heard_s_ago": round(now - self.last_heard, 3),
            "requests_in_flight": len(self.tickets),
            "received": dict(self.received),
            "losses": self.losses,
        }


class ReplicaSync:
    """One replica's side of the decision sharing; owned by the lifespan (`start`, `run`,
    `close`), fed by the router (`decided`, `answered`, `finished`)."""

    def __init__(
        self,
        *,
        bind: str,
        peers: Sequence[str],
        table: SyncPrefixHashTable,
        cost: CostModel,
        known_pod: Callable[[str], bool],
        peer_service: str | None = None,
        heartbeat_s: float = 1.0,
        peer_timeout_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bind_endpoint = bind
        self.peer_endpoints = tuple(peers)
        self.peer_service = peer_service
        self._resolved: set[str] = set()
        """Endpoints connected because the peer service resolved to them."""
        self._table = table
        self._cost = cost
        self._known_pod = known_pod
        self._heartbeat_s = heartbeat_s
        self._peer_timeout_s = peer_timeout_s
        self._clock = clock
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.peers: dict[str, PeerView] = {}
        self.sent: Counter[str] = Counter()
        self.cpu_s = 0.0
        """This thread's CPU spent encoding, sending, receiving and applying messages."""
        self._outbox: list[list[Any]] = []
        self._outbox_bytes = 0
        """What the queued messages will weigh packed, at most."""
        self.dropped = 0
        """Messages not sent (the PUB's high-water mark: a slow peer)."""
        self.rejected: Counter[str] = Counter()
        """Received messages ignored, by reason."""
        self._context = zmq.asyncio.Context()
        # The PUB is sent to from plain router code: a blocking-API socket whose NOBLOCK
        # send fails at once (an asyncio socket would hand back a future instead).
        self._pub_context = zmq.Context()
        self._pub: zmq.Socket[bytes] | None = None
        self._sub: zmq.asyncio.Socket | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the PUB and connect to every peer (a bad endpoint fails start-up)."""
        pub = self._pub_context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 10_000)
        try:
            pub.bind(self.bind_endpoint)
        except zmq.ZMQError as exc:
            pub.close(linger=0)
            raise ConfigError(
                "KVGATE_REPLICA_SYNC_BIND", self.bind_endpoint, f"a free local endpoint ({exc})"
            ) from None
        self.bind_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        for endpoint in self.peer_endpoints:
            sub.connect(endpoint)
        self._pub, self._sub = pub, sub

    async def run(self) -> None:
        """Receive the peers' messages, send heartbeats, drop what lost peers left."""
        sub = self._sub
        if sub is None:
            raise RuntimeError("ReplicaSync.run before start")
        next_beat = next_lookup = self._clock()
        while True:
            now = self._clock()
            if now >= next_beat:
                self._send(["h"])
                self._expire_peers(now)
                next_beat = now + self._heartbeat_s
            if self.peer_service is not None and now >= next_lookup:
                await self._follow_peer_service(sub)
                next_lookup = now + 5 * self._heartbeat_s
            wait_ms = max(0, round((next_beat - self._clock()) * 1000))
            if await sub.poll(timeout=wait_ms):
                self._drain(sub)

    def _drain(self, sub: zmq.asyncio.Socket, limit: int = 1000) -> None:
        """Apply every frame already queued, without a trip through the event loop each
        (the sync shadow of the same socket: a NOBLOCK receive fails at once when empty)."""
        shadow: zmq.Socket[bytes] = zmq.Socket.shadow(sub.underlying)
        with self._timed():
            for _ in range(limit):
                try:
                    frame = shadow.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return
                self.receive(frame)

    @contextlib.contextmanager
    def _timed(self) -> Generator[None, None, None]:
        started = time.thread_time()
        try:
            yield
        finally:
            self.cpu_s += time.thread_time() - started

    async def _follow_peer_service(self, sub: zmq.asyncio.Socket) -> None:
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
        for endpoint in sorted(wanted - self._resolved):
            sub.connect(endpoint)
        for endpoint in sorted(self._resolved - wanted):
            with contextlib.suppress(zmq.ZMQError):
                sub.disconnect(endpoint)
        self._resolved = wanted

    def close(self) -> None:
        self.flush()
        for sock in (self._pub, self._sub):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._sub = None
        self._context.term()
        self._pub_context.term()

    # -- publishing (the router, on the event loop: never blocks) -------------------------

    def decided(self, ticket: Ticket, context: ModelContext, hashes: Sequence[int]) -> None:
        shared = list(hashes[:MAX_HASHES])
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
            self._outbox_bytes + packed_bytes > MAX_MESSAGE_BYTES // 2
            or len(self._outbox) >= MAX_MESSAGES_PER_FRAME
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
            payload = msgpack.packb([WIRE, VERSION, self.replica, outbox])
            try:
                pub.send(payload, flags=zmq.NOBLOCK)
            except zmq.Again:
                self.dropped += len(outbox)
                return
            self.sent.update(body[0] for body in outbox)

    # -- receiving ------------------------------------------------------------------------

    def receive(self, frame: bytes) -> None:
        """Apply one peer frame (anything malformed is counted and ignored)."""
        try:
            message = msgpack.unpackb(frame, raw=False, strict_map_key=True)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            self.rejected["undecodable"] += 1
            return
        if (
            not isinstance(message, list)
            or len(message) != 4
            or message[0] != WIRE
            or message[1] != VERSION
            or not isinstance(message[2], str)
            or not 0 < len(message[2]) <= 200
            or not isinstance(message[3], list)
            or not 0 < len(message[3]) <= MAX_MESSAGES_PER_FRAME
        ):
            self.rejected["malformed"] += 1
            return
        replica = message[2]
        if replica == self.replica:
            return
        for item in message[3]:
            if isinstance(item, list) and item and isinstance(item[0], str):
                self._apply(replica, item[0], item[1:])
            else:
                self.rejected["malformed"] += 1

    def _apply(self, replica: str, kind: str, body: list[Any]) -> None:
        peer = self.peers.get(replica)
        if peer is None:
            if len(self.peers) >= 4 * max(1, len(self.peer_endpoints) + len(self._resolved)):
                self.rejected["too_many_peers"] += 1
                return
            peer = self.peers[replica] = PeerView(replica)
            logger.info("replica sync: peer %s is live", replica)
        peer.last_heard = self._clock()
        if kind == "h" and not body:
            peer.received["h"] += 1
        elif kind == "d" and _decision(body):
            self._decision(peer, body)
        elif kind in ("b", "f") and len(body) == 1 and type(body[0]) is int:
            ticket = peer.tickets.get(body[0]) if kind == "b" else peer.tickets.pop(body[0], None)
            if ticket is not None:
                if kind == "b":
                    self._cost.first_byte(ticket)
                else:
                    self._cost.finish(ticket)
            peer.received[kind] += 1
        else:
            self.rejected["malformed"] += 1

    def _decision(self, peer: PeerView, body: list[Any]) -> None:
        number, pod, model, lora, hashes, own = body
        if not self._known_pod(pod):
            self.rejected["unknown_pod"] += 1
            return
        if hashes:
            try:
                self._table.add_prefix(pod, ModelContext(model, lora), hashes)
            except UnknownPodError:  # discovery has it, the index not yet (or no longer)
                self.rejected["unknown_pod"] += 1
                return
        peer.received["d"] += 1
        previous = peer.tickets.pop(number, None)
        if previous is not None:
            self._cost.finish(previous)
        if len(peer.tickets) >= MAX_TICKETS_PER_PEER:  # bounded: the oldest goes
            self._cost.finish(peer.tickets.pop(next(iter(peer.tickets))))
        peer.tickets[number] = self._cost.start_remote(pod, float(own))

    def _expire_peers(self, now: float) -> None:
        for peer in self.peers.values():
            if peer.tickets and now - peer.last_heard > self._peer_timeout_s:
                logger.warning(
                    "replica sync: peer %s silent for %.1f s; dropping its %d requests",
                    peer.replica, now - peer.last_heard, len(peer.tickets),
                )  # fmt: skip
                for ticket in peer.tickets.values():
                    self._cost.finish(ticket)
                peer.tickets.clear()
                peer.losses += 1

    def view(self) -> dict[str, Any]:
        """For /admin/pods: this replica, its peers and the channel's counters."""
        now = self._clock()
        return {
            "replica": self.replica,
            "bind": self.bind_endpoint,
            "peer_endpoints": list(self.peer_endpoints) + sorted(self._resolved),
            "peer_service": self.peer_service,
            "peers": [p.as_json(now, self._peer_timeout_s) for p in self.peers.values()],
            "sent": dict(self.sent),
            "dropped": self.dropped,
            "rejected": dict(self.rejected),
        }

    def live_peers(self) -> int:
        now = self._clock()
        return sum(now - p.last_heard <= self._peer_timeout_s for p in self.peers.values())


def _decision(body: list[Any]) -> bool:
    """[number, pod, model, lora, hashes, own tokens], each of its type and bounds."""
    if len(body) != 6:
        return False
    number, pod, model, lora, hashes, own = body
    return (
        type(number) is int
        and isinstance(pod, str)
        and 0 < len(pod) <= 512
        and isinstance(model, str)
        and 0 < len(model) <= 512
        and (lora is None or (isinstance(lora, str) and 0 < len(lora) <= 512))
        and isinstance(hashes, list)
        and len(hashes) <= MAX_HASHES
        and _unsigned_64(hashes)
        and isinstance(own, int | float)
        and not isinstance(own, bool)
        and math.isfinite(own)
        and 0 <= own <= 10_000_000
    )


class ReplicaSyncCollector(Collector):
    """The sharing channel's figures at scrape time (zero / empty without replica sync)."""

    def __init__(self, sync: Callable[[], ReplicaSync | None]) -> None:
        self._sync = sync

    def collect(self) -> Iterator[Metric]:
        sync = self._sync()
        live = GaugeMetricFamily(
            "kvgate_replica_sync_peers_live", "Peer replicas heard from within the timeout"
        )
        live.add_metric([], float(sync.live_peers()) if sync is not None else 0.0)
        messages = CounterMetricFamily(
            "kvgate_replica_sync_messages",
            "Decision-sharing messages by direction (sent, received, dropped at the send "
            "queue's limit) and kind (d decision, b first byte, f end, h heartbeat)",
            labels=["direction", "kind"],
        )
        rejected = CounterMetricFamily(
            "kvgate_replica_sync_rejected",
            "Peer messages ignored, by reason (undecodable, malformed, unknown_pod, "
            "too_many_peers)",
            labels=["reason"],
        )
        losses = CounterMetricFamily(
            "kvgate_replica_sync_peer_losses",
            "Times a peer fell silent with requests in flight (its requests were dropped)",
        )
        cpu = CounterMetricFamily(
            "kvgate_replica_sync_cpu_seconds",
            "CPU time of the event loop's thread spent on the sharing channel: encoding and "
            "sending this replica's messages, receiving and applying the peers'",
        )
        if sync is not None:
            for kind, count in sync.sent.items():
                messages.add_metric(["sent", kind], float(count))
            received: Counter[str] = Counter()
            for peer in sync.peers.values():
                received.update(peer.received)
            for kind, count in received.items():
                messages.add_metric(["received", kind], float(count))
            messages.add_metric(["dropped", "any"], float(sync.dropped))
            for reason, count in sync.rejected.items():
                rejected.add_metric([reason], float(count))
            losses.add_metric([], float(sum(p.losses for p in sync.peers.values())))
        cpu.add_metric([], sync.cpu_s if sync is not None else 0.0)
        yield live
        yield messages
        yield rejected
        yield losses
        yield cpu


def _unsigned_64(values: list[Any]) -> bool:
    """Every value an int (no bool) in [0, 2**64), checked in C (a decision has ~100s)."""
    if not values:
        return True
    return set(map(type, values)) == {int} and min(values) >= 0 and max(values) < 1 << 64
