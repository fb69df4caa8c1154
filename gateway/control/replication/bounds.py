"""What a peer replica can make this one believe, and no more.

A peer's decision is applied only when everything in it is something this replica's own
routing could have produced:

- the pod is one discovery reports, and it serves the decision's model (or LoRA adapter)
  in the very index context this replica would use for it (else `unknown_pod` /
  `unknown_model`): a peer never creates a context for a made-up model;
- its expected entries fit in the index with half of each cap left free — contexts,
  blocks per context, router-side entries per pod (else `index_full`): a peer never makes
  the index evict a context, a block or an entry of its own to make room;
- its uncached tokens are clamped to the longest prompt the model accepts (the engines'
  `max_model_len`, else `KVGATE_MAX_PROMPT_TOKENS`, else 128 Ki tokens);
- its requests in flight on a pod stay within what the engine itself reports:
  `max(16, 2 × (running + waiting))` at its last scrape (else `excess_load`), and each
  is dropped after `PEER_TICKET_TTL_S` even from a live peer (the engine's scraped
  counts carry a long request's load from then on);
- each peer spends at most `PEER_MESSAGES_PER_S` messages and `PEER_HASHES_PER_S`
  prefix hashes a second (else `rate_limited`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from indexer import ModelContext, SyncPrefixHashTable, UnknownPodError

if TYPE_CHECKING:
    from gateway.control.registry import PodRegistry
    from gateway.upstream.model_catalog import ModelCatalog

PEER_MESSAGES_PER_S = 20_000
PEER_HASHES_PER_S = 200_000
PEER_TICKET_TTL_S = 60.0
MIN_PEER_TICKETS_PER_POD = 16
FALLBACK_PROMPT_TOKENS = 128 * 1024
INDEX_SHARE = 0.5
"""Of each index cap, the share a peer's entries may take up to (the rest stays free)."""


class Fleet(Protocol):
    """What this replica itself knows of the fleet, which a peer's claims are held to."""

    def known_pod(self, pod: str) -> bool: ...

    def context_of(self, pod: str, model: str, lora: str | None) -> ModelContext | None:
        """The index context this replica would route `model`/`lora` to `pod` in, if the
        pod serves it (None otherwise)."""
        ...

    def prompt_ceiling(self, model: str) -> int:
        """The most prompt tokens a request for `model` can have."""
        ...

    def concurrency(self, pod: str) -> float:
        """The engine's running + waiting requests at its last scrape (every replica's)."""
        ...


class RegistryFleet:
    """`Fleet` from the pod registry, the model catalog and the prompt limit."""

    def __init__(
        self, registry: PodRegistry, catalog: ModelCatalog | None, max_prompt_tokens: int | None
    ) -> None:
        self._registry = registry
        self._catalog = catalog
        self._max_prompt_tokens = max_prompt_tokens

    def known_pod(self, pod: str) -> bool:
        return self._registry.get(pod) is not None

    def context_of(self, pod: str, model: str, lora: str | None) -> ModelContext | None:
        state = self._registry.get(pod)
        served = lora if lora is not None else model
        if state is None or not state.pod.serves(served):
            return None
        context = self._registry.context(served)
        return context if context == ModelContext(model, lora) else None

    def prompt_ceiling(self, model: str) -> int:
        length = self._catalog.max_model_len(model) if self._catalog is not None else None
        if length is not None:
            return length
        return self._max_prompt_tokens or FALLBACK_PROMPT_TOKENS

    def concurrency(self, pod: str) -> float:
        state = self._registry.get(pod)
        return 0.0 if state is None else state.running + state.waiting


class PeerBounds:
    """Checks one peer decision against the fleet and the index (see the module doc)."""

    def __init__(self, fleet: Fleet, table: SyncPrefixHashTable) -> None:
        self._fleet = fleet
        self._table = table

    def context(self, pod: str, model: str, lora: str | None, hashes: int) -> ModelContext | str:
        """The decision's context, or why it is refused."""
        fleet = self._fleet
        if not fleet.known_pod(pod):
            return "unknown_pod"
        context = fleet.context_of(pod, model, lora)
        if context is None:
            return "unknown_model"
        if hashes:
            try:
                room = self._table.expected_headroom(pod, context, keep=1.0 - INDEX_SHARE)
            except UnknownPodError:  # discovery has it, the index not yet (or no longer)
                return "unknown_pod"
            if hashes > room:
                return "index_full"
        return context

    def own_tokens(self, context: ModelContext, own: float) -> float:
        """A peer's uncached tokens, at most the longest prompt the model accepts."""
        return min(own, float(self._fleet.prompt_ceiling(context.lora or context.model)))

    def tickets_allowed(self, pod: str) -> int:
        """A peer's requests in flight on `pod` at most."""
        return max(MIN_PEER_TICKETS_PER_POD, int(2 * self._fleet.concurrency(pod)))
