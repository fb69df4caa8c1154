"""What this replica holds of each peer: its requests in flight (remote tickets in the
cost model), what it sent, and the rate budget it may still spend."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from predictor import Ticket


class TokenBucket:
    """At most `rate` units a second, in bursts of at most `burst`."""

    __slots__ = ("_at", "_burst", "_clock", "_level", "_rate")

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self._rate, self._burst, self._clock = rate, burst, clock
        self._level = burst
        self._at = clock()

    def take(self, units: float) -> bool:
        now = self._clock()
        self._level = min(self._burst, self._level + (now - self._at) * self._rate)
        self._at = now
        if units > self._level:
            return False
        self._level -= units
        return True


@dataclass(slots=True)
class PeerView:
    """One peer (by the id it announces): its tickets by number, oldest first, with when
    each arrived; how many it has on each pod; its message and hash budgets."""

    replica: str
    messages: TokenBucket
    hashes: TokenBucket
    last_heard: float = -math.inf
    received: Counter[str] = field(default_factory=Counter)
    losses: int = 0
    expired: int = 0
    """Its tickets dropped for age while it was live."""
    _tickets: dict[int, tuple[float, Ticket]] = field(default_factory=dict)
    _per_pod: Counter[str] = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self._tickets)

    def on_pod(self, pod: str) -> int:
        return self._per_pod[pod]

    def get(self, number: int) -> Ticket | None:
        found = self._tickets.get(number)
        return None if found is None else found[1]

    def add(self, number: int, ticket: Ticket, now: float) -> None:
        self._tickets[number] = (now, ticket)
        self._per_pod[ticket.pod] += 1

    def pop(self, number: int) -> Ticket | None:
        found = self._tickets.pop(number, None)
        if found is None:
            return None
        ticket = found[1]
        self._per_pod[ticket.pod] -= 1
        if not self._per_pod[ticket.pod]:
            del self._per_pod[ticket.pod]
        return ticket

    def pop_oldest(self) -> Ticket | None:
        return self.pop(next(iter(self._tickets))) if self._tickets else None

    def pop_older_than(self, before: float) -> Iterator[Ticket]:
        """Its tickets that arrived before `before` (oldest first), removed."""
        tickets = self._tickets
        while tickets:
            number, (at, _) = next(iter(tickets.items()))
            if at >= before:
                return
            ticket = self.pop(number)
            assert ticket is not None
            yield ticket

    def pop_all(self) -> list[Ticket]:
        tickets = [ticket for _, ticket in self._tickets.values()]
        self._tickets.clear()
        self._per_pod.clear()
        return tickets

    def as_json(self, now: float, timeout_s: float) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "live": now - self.last_heard <= timeout_s,
            "last_heard_s_ago": round(now - self.last_heard, 3),
            "requests_in_flight": len(self._tickets),
            "received": dict(self.received),
            "losses": self.losses,
            "expired_requests": self.expired,
        }
