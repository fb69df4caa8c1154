"""A pod subscriber's configuration and the state it reports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from subscriber.events import DEFAULT_LIMITS, DecodeLimits


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """Where a pod publishes its KV events."""

    name: str
    model: str
    events: str
    """ZMQ endpoint of the pod's PUB socket (or ours to bind, when `bind`)."""
    replay: str | None = None
    """ZMQ endpoint of the pod's replay ROUTER socket, if it has one."""
    topic: str = ""
    """Topic prefix to subscribe to ("" = everything the socket sends)."""
    bind: bool = False
    """Bind `events` and let the engine connect (engines configured to connect out)."""
    lora_names: Mapping[int, str] = field(default_factory=dict)
    allowed_peers: tuple[str, ...] = ()
    """With `bind`: the only addresses a publisher may connect from (the pod's own); empty
    accepts any (an `ipc://` endpoint, where file permissions decide)."""


@dataclass(frozen=True, slots=True)
class SubscriberSettings:
    replay_timeout_s: float = 3.0
    """Longest wait for each replay reply (and for the first)."""
    live_queue: int = 10_000
    """Live batches buffered while a replay runs; beyond it they are dropped (and replayed)."""
    idle_probe_s: float = 2.0
    """After this long without a live batch, ask the replay buffer whether anything was
    missed: a lost *last* batch is otherwise never noticed (no later seq shows the gap)."""
    reconnect_initial_s: float = 0.1
    reconnect_max_s: float = 10.0
    decode_limits: DecodeLimits = DEFAULT_LIMITS


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a pod's index stands in its engine's event stream: seq and digest (xxh64 of the
    payload) of the last applied batch, and whether the index was whole there.

    A subscriber started from one (an index restored from a snapshot) replays from `seq`
    and compares the digest: the same batch → the engine's history is the snapshot's, only
    what follows is applied; otherwise the existing rules reset and rebuild the pod.
    """

    seq: int
    digest: int
    whole: bool


class Phase(StrEnum):
    STARTING = "starting"
    REPLAYING = "replaying"
    LIVE = "live"
    BACKOFF = "backoff"
    STOPPED = "stopped"


RESET_CAUSES = ("engine_restart", "replay_unavailable", "replay_overrun", "cleared")
"""Why a pod's index was thrown away: the engine restarted; its replay socket did not
answer (rebuilt from live batches); its replay buffer no longer reached back; the engine
cleared its cache (AllBlocksCleared)."""


@dataclass(frozen=True, slots=True)
class PodSubscriberStatus:
    pod: str
    phase: Phase
    connected: bool
    last_seq: int | None
    whole: bool
    """True when the index holds everything the engine announced since a known-empty start."""
    degraded_reason: str | None
    batches_applied: int
    replays: int
    restarts: int
    gaps: int
    idle_probes: int
    live_dropped: int
    frames_rejected: int
    last_message_at: float | None
    resets: Mapping[str, int] = field(default_factory=dict)
    """Index resets of this pod by cause (one of `RESET_CAUSES`)."""
    refused_peers: int = 0
    """Publishers refused on a bound event socket (not from the pod's address)."""


@dataclass(slots=True)
class SubscriberCounters:
    batches_applied: int = 0
    replays: int = 0
    restarts: int = 0
    gaps: int = 0
    idle_probes: int = 0
    live_dropped: int = 0
    frames_rejected: int = 0
    resets: dict[str, int] = field(default_factory=dict)
