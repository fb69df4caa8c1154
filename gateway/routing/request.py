"""What a routing decision looks at."""

from __future__ import annotations

from dataclasses import dataclass

from indexer import MatchResult, ModelContext


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    model: str
    context: ModelContext
    prompt_blocks: int
    """Full blocks of the prompt (0 when it could not be tokenized)."""
    match: MatchResult | None
    """Consecutive blocks each candidate holds; None when the prompt is unknown."""
    session: str | None = None
