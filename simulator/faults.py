"""Fault injection state for `POST /sim/faults`.

Faults (any combination in one body):
- `{"drop_batches": N}`: the next N event batches are not sent on PUB (still replayable).
- `{"drop_fraction": p, "seconds": s}`: for s seconds each batch is dropped with probability p.
- `{"restart_publisher": true, "wipe_cache": false}`: new sockets, seq from 0, empty replay
  buffer (like an engine restart); the engine then announces every block it kept, as a
  restarted engine with a persistent tier does. With `wipe_cache` the cache is emptied,
  silently, nothing is announced, and every running request ends as in a real restart
  (streams are cut, non-streamed requests get a 503).
- `{"stall_ms": ms, "seconds": s}`: for s seconds every engine step takes ms longer.
- `{"fail_requests": N, "status": 503}`: the next N generation requests fail with that status.
- `{"close_midstream": N}`: the next N streaming responses are cut after their first chunk.
- `{"overrun_replay": N}`: the next N batches are not sent on PUB and the replay buffer
  forgets every batch before each of them, as if more batches had passed than it holds: a
  subscriber's replay can no longer reach back to what it last applied.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_KNOWN = frozenset(
    {
        "drop_batches",
        "drop_fraction",
        "seconds",
        "restart_publisher",
        "wipe_cache",
        "stall_ms",
        "fail_requests",
        "status",
        "close_midstream",
        "overrun_replay",
    }
)


class FaultSpecError(ValueError):
    """An invalid fault request; the message names the field and the value."""


def _number(spec: Mapping[str, Any], key: str, *, low: float, high: float | None = None) -> float:
    value = spec[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultSpecError(f"{key} must be a number, got {value!r}")
    if value < low or (high is not None and value > high):
        raise FaultSpecError(f"{key} must be in [{low}, {high if high is not None else 'inf'}]")
    return float(value)


@dataclass
class Faults:
    clock: Callable[[], float]
    rng: random.Random
    drop_batches: int = 0
    drop_fraction: float = 0.0
    drop_until: float = 0.0
    stall_s: float = 0.0
    stall_until: float = 0.0
    fail_requests: int = 0
    fail_status: int = 503
    close_midstream: int = 0
    overrun_replay: int = 0
    fired: dict[str, int] = field(default_factory=dict)

    def arm(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and arm the faults in `spec`; returns what was armed.

        `restart_publisher` is returned for the engine to carry out; it is not stored.
        """
        unknown = set(spec) - _KNOWN
        if unknown:
            raise FaultSpecError(f"unknown fault fields: {sorted(unknown)}")
        armed: dict[str, Any] = {}
        now = self.clock()
        seconds = _number(spec, "seconds", low=0) if "seconds" in spec else None
        if "drop_batches" in spec:
            self.drop_batches += int(_number(spec, "drop_batches", low=0))
            armed["drop_batches"] = self.drop_batches
        if "drop_fraction" in spec:
            if seconds is None:
                raise FaultSpecError("drop_fraction needs seconds")
            self.drop_fraction = _number(spec, "drop_fraction", low=0, high=1)
            self.drop_until = now + seconds
            armed["drop_fraction"] = {"fraction": self.drop_fraction, "seconds": seconds}
        if "stall_ms" in spec:
            if seconds is None:
                raise FaultSpecError("stall_ms needs seconds")
            self.stall_s = _number(spec, "stall_ms", low=0) / 1e3
            self.stall_until = now + seconds
            armed["stall_ms"] = {"stall_ms": self.stall_s * 1e3, "seconds": seconds}
        if "fail_requests" in spec:
            status = int(_number(spec, "status", low=400, high=599)) if "status" in spec else 503
            self.fail_requests += int(_number(spec, "fail_requests", low=0))
            self.fail_status = status
            armed["fail_requests"] = {"count": self.fail_requests, "status": status}
        if "close_midstream" in spec:
            self.close_midstream += int(_number(spec, "close_midstream", low=0))
            armed["close_midstream"] = self.close_midstream
        if "overrun_replay" in spec:
            self.overrun_replay += int(_number(spec, "overrun_replay", low=0))
            armed["overrun_replay"] = self.overrun_replay
        if spec.get("restart_publisher"):
            armed["restart_publisher"] = {"wipe_cache": bool(spec.get("wipe_cache", False))}
        if not armed:
            raise FaultSpecError("no fault given")
        return armed

    def _fire(self, name: str) -> None:
        self.fired[name] = self.fired.get(name, 0) + 1

    def should_drop_batch(self) -> bool:
        if self.drop_batches > 0:
            self.drop_batches -= 1
            self._fire("drop_batches")
            return True
        active = self.drop_fraction > 0 and self.clock() < self.drop_until
        if active and self.rng.random() < self.drop_fraction:
            self._fire("drop_fraction")
            return True
        return False

    def take_overrun(self) -> bool:
        """True for a batch that must be dropped and leave the replay buffer behind it."""
        if self.overrun_replay > 0:
            self.overrun_replay -= 1
            self._fire("overrun_replay")
            return True
        return False

    def step_delay(self) -> float:
        if self.stall_s > 0 and self.clock() < self.stall_until:
            self._fire("stall_ms")
            return self.stall_s
        return 0.0

    def take_request_failure(self) -> int | None:
        if self.fail_requests > 0:
            self.fail_requests -= 1
            self._fire("fail_requests")
            return self.fail_status
        return None

    def take_midstream_close(self) -> bool:
        if self.close_midstream > 0:
            self.close_midstream -= 1
            self._fire("close_midstream")
            return True
        return False
