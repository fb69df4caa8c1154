"""The models the fleet serves, as the engines themselves list them (`GET /v1/models`).

Each pod's answer is cached: fetched the first time the list is asked for after the pod
appears, and again every `interval_s` from then on. The list merges the cards of the pods that are
ready and healthy, in pod-name order, one card per model id (the first pod's), only for
models discovery says the pod serves (the list names what the gateway routes); every field
the engine sent is kept (`max_model_len`, `root`, `parent`, `owned_by`; a LoRA adapter is
its own card with `parent` naming its base model, as vLLM lists it). A pod that is down,
removed, or fails to answer drops out with its cards.

The router reads each model's `max_model_len` from the cards (the longest prompt an engine
serves, which bounds what the gateway tokenizes), so every pod is asked soon after it
appears, and again every `interval_s`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from gateway.control.registry import PodRegistry, PodState

logger = logging.getLogger(__name__)

Card = dict[str, Any]


class ModelCatalog:
    def __init__(
        self,
        registry: PodRegistry,
        client: httpx.AsyncClient,
        *,
        interval_s: float = 10.0,
        timeout_s: float = 2.0,
    ) -> None:
        self._registry = registry
        self._client = client
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._cards: dict[str, list[Card]] = {}
        """Per pod, the cards of its last good answer."""
        self._asked: set[str] = set()
        """Pods asked at least once (answered or not): the list does not wait for them."""

    async def run(self) -> None:
        """Read every pod's cards, then again every `interval_s` (a supervised background
        task); a pod that appears meanwhile is read within a second."""
        refreshed = -self._interval_s
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() - refreshed >= self._interval_s
            states = self._registry.all()
            if due:
                refreshed = loop.time()
                await self.refresh(list(states))
            else:
                await self.refresh([s for s in states if s.name not in self._asked])
            await asyncio.sleep(min(1.0, self._interval_s))

    def max_model_len(self, model: str) -> int | None:
        """The smallest `max_model_len` the pods serving `model` report (None: none says)."""
        lengths = [
            card["max_model_len"]
            for cards in self._cards.values()
            for card in cards
            if card["id"] == model
            and isinstance(card.get("max_model_len"), int)
            and not isinstance(card.get("max_model_len"), bool)
            and card["max_model_len"] > 0
        ]
        return min(lengths) if lengths else None

    async def refresh(self, states: list[PodState]) -> None:
        live = {state.name for state in self._registry.all()}
        for name in [name for name in self._cards if name not in live]:
            del self._cards[name]
        self._asked &= live
        if states:
            await asyncio.gather(*(self._fetch(state) for state in states))

    async def _fetch(self, state: PodState) -> None:
        self._asked.add(state.name)
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._client.get(
                    f"{state.pod.url}/v1/models", timeout=self._timeout_s
                )
            response.raise_for_status()
            cards = _cards(response.json())
        except (httpx.HTTPError, TimeoutError, ValueError) as exc:
            if self._cards.pop(state.name, None) is not None:
                logger.info("pod %s dropped from /v1/models: %s", state.name, exc)
            return
        self._cards[state.name] = cards

    async def cards(self) -> list[Card]:
        """The merged list; pods never asked yet are asked first."""
        up = [s for s in self._registry.all() if s.pod.ready and s.healthy]
        new = [state for state in up if state.name not in self._asked]
        if new:
            await self.refresh(new)
        merged: dict[str, Card] = {}
        for state in sorted(up, key=lambda s: s.name):
            for card in self._cards.get(state.name, ()):
                if state.pod.serves(card["id"]):
                    merged.setdefault(card["id"], card)
        return list(merged.values())


def _cards(document: Any) -> list[Card]:
    """The model cards of an OpenAI-style list (`{"object": "list", "data": [...]}`)."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ValueError("not a model list: no `data` array")
    return [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]
