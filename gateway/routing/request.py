"""What a routing decision looks at, and what its plugins share while deciding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.control.registry import PodState
from gateway.routing.terms import DecisionTerms
from indexer import MatchResult, ModelContext
from predictor import Prediction


@dataclass(slots=True)  # not frozen: one per decision, and a frozen __init__ costs 2.4×
class RoutingRequest:
    """What one decision looks at (read-only once built; plugins share `state`)."""

    model: str
    context: ModelContext
    prompt_blocks: int
    """Full blocks of the prompt (0 when it could not be tokenized)."""
    match: MatchResult | None
    """Consecutive blocks each candidate holds; None when the prompt is unknown."""
    session: str | None = None
    prompt_tokens: int = 0
    """Prompt length in tokens: exact when tokenized, else estimated from the body's size."""
    prompt_tokenized: bool = False
    """Whether `prompt_tokens` is exact."""
    body_bytes: int = 0
    """The size of the client's request body (what an untokenized prompt is estimated from)."""
    client: str = ""
    """Who sent it (`gateway.http.api.client_key`): an untokenized prompt's size is estimated
    from what this client's own earlier prompts taught."""
    prefix_hashes: Sequence[int] = ()
    slo_ttft_s: float | None = None
    """The client's time-to-first-token objective (`x-slo-ttft-ms`), if any."""
    slo_tpot_s: float | None = None
    """The client's time-per-output-token objective (`x-slo-tpot-ms`), if any."""
    streamed: bool = True
    opens_conversation: bool = False
    """A chat's first turn (no assistant or tool message yet): where it goes, its later
    turns follow, so its pod is a placement, not just this request's fastest answer."""
    preamble_share: float = 0.0
    """Of a first turn's text, the share in its leading system (or developer) messages:
    the part it may share with other conversations."""
    candidates: Sequence[PodState] | None = None
    """The pods the router's decision starts from (the model's serving pods)."""
    routable: Sequence[PodState] | None = None
    """Of `candidates`, the routable ones (ready and healthy) and their `routable_names`,
    when known without a scan (the registry's cached tuple): read, never changed."""
    routable_names: tuple[str, ...] = ()
    state: CycleState = field(default_factory=lambda: CycleState())
    """Scratch space of this decision, shared by its plugins."""


@dataclass(slots=True)
class CycleState:
    """Scratch space of one decision, shared by its plugins (llm-d's CycleState)."""

    predictions: dict[str, Prediction] = field(default_factory=dict)
    """Predicted TTFT per candidate, filled by the first plugin that needs it."""
    terms: DecisionTerms | None = None
    """The candidates' cost terms, made by the first cost plugin that needs them."""
    decided: bool = False
    """The filters ordered the candidates (the pods meeting a TTFT objective, by cache
    affinity): the picker keeps their order, then `fallback`'s."""
    fallback: list[PodState] = field(default_factory=list)
    """Pods a filter set apart, ranked after the picker's as retry targets."""
    tpot_bar: float | None = None
    """A stream no ranked pod is predicted to decode within this is refused (429)."""
