"""A routed request: the decision, what it looked at, and the work it became on its pod;
and who else hears of it (`DecisionSink`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.routing import Decision, Prediction, RoutingRequest, Ticket
from indexer import ModelContext


@dataclass(slots=True)
class Routed:
    decision: Decision
    request: RoutingRequest
    ticket: Ticket | None = None
    """The request's work on the pod it was sent to (the cost model's bookkeeping)."""

    @property
    def prefix_hashes(self) -> Sequence[int]:
        return self.request.prefix_hashes

    def matched_blocks(self, pod: str) -> int:
        match = self.request.match
        return match.matched(pod) if match is not None else 0

    def prediction(self, pod: str) -> Prediction | None:
        return self.decision.predictions.get(pod)


class DecisionSink(Protocol):
    """Hears of every routed request's life (the replica sync shares it with the peers)."""

    def decided(self, ticket: Ticket, context: ModelContext, hashes: Sequence[int]) -> None: ...
    def answered(self, ticket: Ticket) -> None: ...
    def finished(self, ticket: Ticket) -> None: ...
