"""The lease book: every pin the gateway holds, with its TTL, and per pod the counted
engine hashes it holds pinned (the ledger the engine's own pin counts must equal).

Pure bookkeeping, no I/O: the `PinManager` calls the engine and records the outcome here.
"""

from __future__ import annotations

import itertools
import secrets
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gateway.observability.logs import REQUEST_ID
from indexer import EngineHash, ModelContext, Tier

Source = Literal["admin", "request"]
LeaseState = Literal["pinned", "pending", "no_pin_support"]


@dataclass(slots=True)
class Lease:
    """One pin: a prompt prefix held on one pod until `expires_at`."""

    id: str
    pod: str
    model: str
    context: ModelContext
    tokens: Sequence[int]
    """The prompt's token ids, packed (4 bytes each: `packed_tokens`)."""
    gateway_hashes: list[int]
    """Full gateway blocks of `tokens`: the last one names the whole prefix (chained)."""
    ttl_s: float
    expires_at: float
    created_at: float
    source: Source
    session: str | None = None
    held: list[EngineHash] = field(default_factory=list)
    """Engine hashes this lease holds pinned on the engine, each once."""
    tiers: dict[Tier, int] = field(default_factory=dict)
    """Where the held blocks are, as last seen in the index."""
    complete: bool = False
    """`held` covers every gateway block of the prompt: no need to re-resolve it."""
    lost: bool = False
    """The engine dropped our pins (restart, clear, auto-unpin): a re-pin is a repin."""
    unsupported: bool = False
    checked_at: tuple[int, int] | None = None
    """The pod's index generation when this lease was last resolved against it: an
    incomplete lease is resolved again only once the index changed."""
    request_id: str | None = field(default_factory=REQUEST_ID.get)
    """The request that made it (`/admin/pin`, or a chat request's `x-kvgate-pin`)."""

    @property
    def state(self) -> LeaseState:
        if self.unsupported:
            return "no_pin_support"
        return "pinned" if self.held else "pending"

    def view(self, now: float) -> dict[str, object]:
        return {
            "id": self.id,
            "pod": self.pod,
            "model": self.model,
            "source": self.source,
            "session": self.session,
            "request_id": self.request_id,
            "state": self.state,
            "blocks": len(self.held),
            "tiers": {tier.name: n for tier, n in self.tiers.items() if n},
            "prompt_tokens": len(self.tokens),
            "ttl_s": self.ttl_s,
            "expires_in_s": round(max(0.0, self.expires_at - now), 3),
        }


def packed_tokens(tokens: Iterable[int]) -> Sequence[int]:
    """Token ids as 4-byte unsigned ints: a lease keeps its prompt for its whole life (to
    resolve the pod's engine blocks, partial ones included), at a seventh of a list's size."""
    return array("I", tokens)


class LeaseBook:
    """Leases by id, by session and by pod, and each pod's pin ledger."""

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._sessions: dict[tuple[str, str], str] = {}
        self._ledgers: dict[str, Counter[EngineHash]] = {}
        self._epochs: dict[str, int] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._leases)

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._leases.values()))

    def new_id(self) -> str:
        return f"pin-{next(self._ids)}-{secrets.token_hex(4)}"

    def add(self, lease: Lease) -> None:
        self._leases[lease.id] = lease
        if lease.session is not None:
            self._sessions[(lease.model, lease.session)] = lease.id

    def get(self, lease_id: str) -> Lease | None:
        return self._leases.get(lease_id)

    def by_session(self, model: str, session: str) -> Lease | None:
        lease_id = self._sessions.get((model, session))
        return self._leases.get(lease_id) if lease_id is not None else None

    def extended_by(
        self, context: ModelContext, hashes: Sequence[int], source: Source
    ) -> Lease | None:
        """The lease of `source` whose prefix is the longest prefix of `hashes` (a
        conversation's earlier turn: gateway hashes are chained, so one equal hash at the
        same position means the whole prefix is the same)."""
        best: Lease | None = None
        for lease in self._leases.values():
            n = len(lease.gateway_hashes)
            if (
                lease.source == source
                and lease.context == context
                and 0 < n <= len(hashes)
                and hashes[n - 1] == lease.gateway_hashes[-1]
                and (best is None or n > len(best.gateway_hashes))
            ):
                best = lease
        return best

    def remove(self, lease: Lease) -> None:
        self._leases.pop(lease.id, None)
        if lease.session is not None:
            key = (lease.model, lease.session)
            if self._sessions.get(key) == lease.id:
                del self._sessions[key]

    def on_pod(self, pod: str) -> list[Lease]:
        return [lease for lease in self._leases.values() if lease.pod == pod]

    def pods(self) -> set[str]:
        return {lease.pod for lease in self._leases.values()} | {
            pod for pod, ledger in self._ledgers.items() if ledger
        }

    def expired(self, now: float) -> list[Lease]:
        return [lease for lease in self._leases.values() if lease.expires_at <= now]

    # -- the ledger -----------------------------------------------------------------------

    def ledger(self, pod: str) -> Counter[EngineHash]:
        return self._ledgers.setdefault(pod, Counter())

    def pinned_blocks(self, pod: str) -> int:
        """Distinct engine blocks the gateway holds pinned on `pod`."""
        return len(self._ledgers.get(pod, ()))

    def would_hold(self, pod: str, hashes: Iterable[EngineHash]) -> int:
        """Distinct pinned blocks on `pod` if `hashes` were pinned too."""
        ledger = self._ledgers.get(pod, Counter())
        return len(ledger) + sum(1 for h in set(hashes) if h not in ledger)

    def hold(self, lease: Lease, hashes: list[EngineHash]) -> None:
        self.ledger(lease.pod).update(hashes)
        lease.held = hashes

    def release(self, lease: Lease) -> list[EngineHash]:
        """Forget what the lease holds; returns the hashes to unpin on the engine."""
        held, lease.held, lease.complete = lease.held, [], False
        ledger = self.ledger(lease.pod)
        ledger.subtract(held)
        for engine_hash in held:
            if ledger[engine_hash] <= 0:
                del ledger[engine_hash]
        return held

    def drop_pod_pins(self, pod: str) -> list[EngineHash]:
        """The engine lost (or may have lost) every pin on `pod`: forget them all. Returns
        the counted hashes to unpin once, so the engine ends at zero either way."""
        ledger = self._ledgers.pop(pod, Counter())
        for lease in self.on_pod(pod):
            if lease.held:
                lease.lost = True
            lease.held, lease.complete, lease.tiers = [], False, {}
        return list(ledger.elements())

    def epoch(self, pod: str) -> int | None:
        return self._epochs.get(pod)

    def set_epoch(self, pod: str, epoch: int) -> None:
        self._epochs[pod] = epoch
