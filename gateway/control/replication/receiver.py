"""The receiving side of the replica channel: peer frames applied to this replica's index
and cost model, within what `bounds.py` allows, and what each peer left behind dropped
when it falls silent or its requests grow old."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from gateway.control.replication import wire
from gateway.control.replication.bounds import PEER_HASHES_PER_S, PEER_MESSAGES_PER_S, PeerBounds
from gateway.control.replication.peers import PeerView, TokenBucket
from indexer import SyncPrefixHashTable
from predictor import Predictor

logger = logging.getLogger(__name__)

MAX_TICKETS_PER_PEER = 20_000
PEER_FORGET_S = 60.0
"""A peer silent for this long is forgotten (its slot freed for another)."""


class PeerReceiver:
    """Applies the peers' frames (`receive`) and expires what they left (`expire`).

    `rejected` counts what was ignored, by reason; the channel adds its own reasons
    (refused keys, rate limits on raw frames) to the same counter.
    """

    def __init__(
        self,
        *,
        replica: str,
        table: SyncPrefixHashTable,
        cost: Predictor,
        bounds: PeerBounds,
        max_peers: Callable[[], int],
        peer_timeout_s: float,
        ticket_ttl_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._replica = replica
        self._table = table
        self._cost = cost
        self._bounds = bounds
        self._max_peers = max_peers
        self._peer_timeout_s = peer_timeout_s
        self._ticket_ttl_s = ticket_ttl_s
        self._clock = clock
        self.peers: dict[str, PeerView] = {}
        self.received: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.losses = 0
        """Times a peer fell silent with requests in flight."""
        self.expired = 0
        """Peer requests dropped for age while their peer was live."""

    def receive(self, frame: bytes) -> None:
        """Apply one peer frame (anything malformed or beyond a bound is counted and
        ignored)."""
        decoded = wire.decode(frame)
        if isinstance(decoded, str):
            self.rejected[decoded] += 1
            return
        replica, messages = decoded
        if replica == self._replica:
            return
        peer = self._peer(replica)
        if peer is None:
            self.rejected["too_many_peers"] += len(messages)
            return
        peer.last_heard = self._clock()
        if not peer.messages.take(len(messages)):
            self.rejected["rate_limited"] += len(messages)
            return
        for item in messages:
            if isinstance(item, list) and item and isinstance(item[0], str):
                self._apply(peer, item[0], item[1:])
            else:
                self.rejected["malformed"] += 1

    def _peer(self, replica: str) -> PeerView | None:
        peer = self.peers.get(replica)
        if peer is None:
            if len(self.peers) >= self._max_peers():
                return None
            clock = self._clock
            peer = self.peers[replica] = PeerView(
                replica,
                messages=TokenBucket(PEER_MESSAGES_PER_S, PEER_MESSAGES_PER_S, clock),
                hashes=TokenBucket(PEER_HASHES_PER_S, PEER_HASHES_PER_S, clock),
            )
            logger.info("replica sync: peer %s is live", replica)
        return peer

    def _apply(self, peer: PeerView, kind: str, body: list[Any]) -> None:
        if kind == "h" and not body:
            self._received(peer, "h")
        elif kind == "d" and wire.valid_decision(body):
            self._decision(peer, body)
        elif kind in ("b", "f") and len(body) == 1 and type(body[0]) is int:
            ticket = peer.get(body[0]) if kind == "b" else peer.pop(body[0])
            if ticket is not None:
                if kind == "b":
                    self._cost.first_byte(ticket)
                else:
                    self._cost.finish(ticket)
            self._received(peer, kind)
        else:
            self.rejected["malformed"] += 1

    def _received(self, peer: PeerView, kind: str) -> None:
        peer.received[kind] += 1
        self.received[kind] += 1

    def _decision(self, peer: PeerView, body: list[Any]) -> None:
        number, pod, model, lora, hashes, own = body
        bounds = self._bounds
        context = bounds.context(pod, model, lora, len(hashes))
        if isinstance(context, str):
            self.rejected[context] += 1
            return
        previous = peer.pop(number)
        if previous is not None:
            self._cost.finish(previous)
        if peer.on_pod(pod) >= bounds.tickets_allowed(pod):
            self.rejected["excess_load"] += 1
            return
        if hashes and not peer.hashes.take(len(hashes)):
            self.rejected["rate_limited"] += 1
            return
        if hashes:
            self._table.add_prefix(pod, context, hashes)
        self._received(peer, "d")
        if len(peer) >= MAX_TICKETS_PER_PEER:  # bounded: the oldest goes
            oldest = peer.pop_oldest()
            if oldest is not None:
                self._cost.finish(oldest)
        ticket = self._cost.start_remote(pod, bounds.own_tokens(context, float(own)))
        peer.add(number, ticket, self._clock())

    def expire(self, now: float) -> None:
        """Drop the requests of peers silent past the timeout, requests older than the
        ticket lifetime even from live peers, and peers silent past `PEER_FORGET_S`."""
        for replica, peer in list(self.peers.items()):
            silent = now - peer.last_heard
            if len(peer) and silent > self._peer_timeout_s:
                logger.warning(
                    "replica sync: peer %s silent for %.1f s; dropping its %d requests",
                    peer.replica, silent, len(peer),
                )  # fmt: skip
                for ticket in peer.pop_all():
                    self._cost.finish(ticket)
                peer.losses += 1
                self.losses += 1
            for ticket in peer.pop_older_than(now - self._ticket_ttl_s):
                self._cost.finish(ticket)
                peer.expired += 1
                self.expired += 1
            if silent > PEER_FORGET_S:
                del self.peers[replica]

    def live_peers(self, now: float) -> int:
        return sum(now - p.last_heard <= self._peer_timeout_s for p in self.peers.values())

    def peers_json(self, now: float) -> list[dict[str, Any]]:
        return [p.as_json(now, self._peer_timeout_s) for p in self.peers.values()]
