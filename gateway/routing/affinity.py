"""Pin affinity as a routing plugin: a pinned conversation stays on the pod holding its pins."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.control.registry import PodState
from gateway.routing.request import RoutingRequest
from indexer import ModelContext

Affinity = Callable[[str, ModelContext, str | None, Sequence[int]], str | None]
"""(model, context, session, prefix hashes) -> the pod the request should stay on."""


class PinAffinityPreference:
    """Puts first the pod holding the request's pin lease (its session's, else the
    conversation lease its prompt extends) when that pod is a candidate; the others stay
    behind it as retry targets."""

    name = "pin-affinity"

    def __init__(self, affinity: Affinity | None) -> None:
        self._affinity = affinity
        """The pin manager's lease lookup; None: no pins (a gateway's profiles checked
        without one, a benchmark's)."""

    def prefer(self, request: RoutingRequest, pods: Sequence[PodState]) -> str | None:
        affinity = self._affinity
        if affinity is None or not pods:
            return None
        return affinity(request.model, request.context, request.session, request.prefix_hashes)
