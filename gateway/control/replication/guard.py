"""Who may read a replica's decisions: the PUB's ZAP handler and handshake watch.

With CURVE keys the PUB is a CURVE server; ZMQ asks the ZAP handler (a REP socket bound
at `inproc://zeromq.zap.01` of the PUB's own ZMQ context, apart from the KV event
subscribers') about every client that completed the key exchange, and this one admits
only clients whose public key is trusted. Clients that fail the handshake before that
(no CURVE, or not this replica's server key) are seen on the PUB's monitor socket. Both
are counted (`refused_key`, `handshake_failed`) and logged now and then.

Bound before the PUB: ZMQ accepts every CURVE client when no handler is bound.
"""

from __future__ import annotations

import logging
from collections import Counter

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.control.replication.keys import CurveKeys

logger = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
DOMAIN = b"kvgate-replicas"
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


class ChannelGuard:
    """The PUB's ZAP handler and monitor; `poll_sockets` join the channel's poller and
    `handle` answers whichever is readable (on the event loop: both are rare)."""

    def __init__(self, context: zmq.asyncio.Context, keys: CurveKeys, counts: Counter[str]):
        self._keys = keys
        self._counts = counts
        zap = context.socket(zmq.REP)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind(ZAP_ENDPOINT)
        self._zap: zmq.asyncio.Socket = zap
        self._monitor: zmq.asyncio.Socket | None = None

    def secure(self, pub: zmq.asyncio.Socket) -> None:
        """Make `pub` a CURVE server behind this handler (before it binds)."""
        pub.setsockopt(zmq.CURVE_SECRETKEY, self._keys.secret.encode("ascii"))
        pub.setsockopt(zmq.CURVE_SERVER, 1)  # after the keys: setting one resets it
        pub.setsockopt(zmq.ZAP_DOMAIN, DOMAIN)
        monitor = pub.get_monitor_socket(_FAILED)
        assert isinstance(monitor, zmq.asyncio.Socket)
        self._monitor = monitor

    def poll_sockets(self) -> list[zmq.asyncio.Socket]:
        return [self._zap] + ([self._monitor] if self._monitor is not None else [])

    async def handle(self, socket: zmq.asyncio.Socket) -> None:
        if socket is self._zap:
            request = await socket.recv_multipart()
            await socket.send_multipart(self.decide(request))
        elif socket is self._monitor:
            event = parse_monitor_message(await socket.recv_multipart())
            if event["event"] & _FAILED:
                self._refused("handshake_failed", f"a handshake failed ({event['value']})")

    def decide(self, frames: list[bytes]) -> list[bytes]:
        """A ZAP reply (RFC 27): 200 for a CURVE client with a trusted key, else 400."""
        if len(frames) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, mechanism = frames[0], frames[1], frames[5]
        if mechanism == b"CURVE" and len(frames) >= 7 and self._keys.trusts(frames[6]):
            return [version, request_id, b"200", b"OK", b"", b""]
        address = frames[3].decode(errors="replace")
        self._refused("refused_key", f"refused a subscriber from {address} (untrusted key)")
        return [version, request_id, b"400", b"untrusted key", b"", b""]

    def _refused(self, reason: str, what: str) -> None:
        counts = self._counts
        counts[reason] += 1
        if counts[reason] == 1 or counts[reason] % 100 == 0:
            logger.warning("replica sync: %s; %d so far", what, counts[reason])

    def close(self) -> None:
        for socket in self.poll_sockets():
            socket.close(linger=0)
        self._monitor = None
