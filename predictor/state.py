"""What another gateway's cost model export may hold (`/admin/cost-model`, the snapshot
directory's `cost-model.json`), parsed and checked before anything of it is adopted.

A replacement replica starts from a peer's learned model, so a peer's answer is input
like any other: it is read with a byte cap, parsed with every number finite (`NaN`,
`Infinity` and `1e400` are refused, not turned into floats), and every field checked for
its type and its range — the ranges the model's own learning keeps to (`features.py`).
Anything else raises `CostStateError` with a reason, and nothing of it is taken: the
replica starts from its prior.

A real export weighs 1.3 KB for the fleet's model plus, per answered pod, its name, its
log-speed and its answer count: 0.35 MB for `MAX_PODS` pods with names of 27 characters
(a Deployment's pods'), 1.3 MB with names of the longest a pod may have (253).
`MAX_EXPORT_BYTES` leaves three times that.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from predictor.features import (
    MAX_COEFFICIENT,
    MAX_LOG_SPEED,
    MAX_OBSERVATIONS,
    MAX_PODS,
    MAX_SECONDS,
)

if TYPE_CHECKING:
    from predictor.fleet import PodSpeed, TtftModel

EXPORT_VERSION = 2
"""2: one fleet model and a speed per pod (1 was a full model per pod: refused)."""
MAX_EXPORT_BYTES = 4 * 1024 * 1024
MAX_POD_NAME = 253
"""A pod's name is at most this long (a Kubernetes name; the pods file's rule)."""
REASONS = ("peer_unavailable", "too_large", "malformed", "non_finite", "out_of_range",
           "unsupported_version")  # fmt: skip
"""Why an export is refused (`kvgate_bootstrap_rejected_total{reason}`)."""


class CostStateError(Exception):
    """An export not taken: `reason` is one of `REASONS`, `detail` says what (one line)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class FleetState:
    """The fleet's TTFT model as exported (`fleet.TtftModel.state()`), checked."""

    theta: tuple[float, ...]
    p: tuple[tuple[float, ...], ...]
    residual_scale: float
    reference: float
    observations: int


@dataclass(frozen=True, slots=True)
class CostExport:
    """A checked export: the fleet's model and each answered pod's (log-speed, answers)."""

    fleet: FleetState
    speeds: Mapping[str, tuple[float, int]]


def export_state(fleet: TtftModel, speeds: Mapping[str, PodSpeed]) -> dict[str, Any]:
    """A predictor's learned state as JSON: the fleet's model and each answered pod's
    speed (what `check_export` reads back)."""
    return {
        "version": EXPORT_VERSION,
        "fleet": fleet.state(),
        "speeds": {
            name: {"log": speed.log, "observations": speed.observations}
            for name, speed in speeds.items()
        },
    }


class _NonFinite(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text[:40])
    return value


def _no_constant(text: str) -> float:
    raise _NonFinite(text)


def parse_export(data: bytes) -> Any:
    """The export's JSON, every number in it finite; CostStateError for anything else.
    Blocking (up to `MAX_EXPORT_BYTES` of JSON): the gateway runs it in a thread."""
    if len(data) > MAX_EXPORT_BYTES:
        raise CostStateError("too_large", f"{len(data)} bytes > {MAX_EXPORT_BYTES}")
    try:
        return json.loads(data, parse_float=_finite, parse_constant=_no_constant)
    except _NonFinite as exc:
        raise CostStateError("non_finite", f"a number that is not finite ({exc})") from None
    except RecursionError:
        raise CostStateError("malformed", "JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int of 4300+ digits
        raise CostStateError("malformed", f"not JSON ({str(exc)[:100]})") from None


def check_export(raw: Any, *, features: int, max_trace: float) -> CostExport:
    """`raw` (a parsed export) as a `CostExport`, every field of the right type and in its
    range: `features` coefficients in [0, MAX_COEFFICIENT], a covariance whose trace is at
    most `max_trace` (what the model's learning keeps it to), and so on."""
    if not isinstance(raw, dict):
        raise CostStateError("malformed", f"a {type(raw).__name__}, not an object")
    if raw.get("version") != EXPORT_VERSION:
        raise CostStateError("unsupported_version", f"version {str(raw.get('version'))[:20]}")
    return CostExport(_fleet(raw.get("fleet"), features, max_trace), _speeds(raw.get("speeds")))


def _fleet(raw: Any, n: int, max_trace: float) -> FleetState:
    if not isinstance(raw, dict):
        raise CostStateError("malformed", "fleet: not an object")
    theta = tuple(_number(v, 0.0, MAX_COEFFICIENT, "fleet.theta") for v in _list(raw, "theta", n))
    p = tuple(
        tuple(_number(v, -max_trace, max_trace, "fleet.p") for v in _list(row, None, n))
        for row in _list(raw, "p", n)
    )
    if sum(p[i][i] for i in range(n)) > max_trace:
        raise CostStateError("out_of_range", f"fleet.p: a trace beyond {max_trace:g}")
    return FleetState(
        theta,
        p,
        _number(raw.get("residual_scale"), 0.0, MAX_SECONDS, "fleet.residual_scale"),
        _number(raw.get("reference"), 0.0, MAX_SECONDS, "fleet.reference"),
        _count(raw.get("observations"), 0, "fleet.observations"),
    )


def _speeds(raw: Any) -> dict[str, tuple[float, int]]:
    if not isinstance(raw, dict):
        raise CostStateError("malformed", "speeds: not an object")
    if len(raw) > MAX_PODS:
        raise CostStateError("too_large", f"speeds of {len(raw)} pods > {MAX_PODS}")
    speeds = {}
    for name, state in raw.items():
        if not 0 < len(name) <= MAX_POD_NAME:
            raise CostStateError("malformed", f"speeds: a pod name of {len(name)} characters")
        if not isinstance(state, dict):
            raise CostStateError("malformed", "speeds: a pod's speed is not an object")
        log = _number(state.get("log"), -MAX_LOG_SPEED, MAX_LOG_SPEED, "speeds.log")
        speeds[name] = (log, _count(state.get("observations"), 1, "speeds.observations"))
    return speeds


def _list(raw: Any, key: str | None, size: int) -> list[Any]:
    value = raw if key is None else raw.get(key)
    if not isinstance(value, list) or len(value) != size:
        raise CostStateError("malformed", f"fleet.{key or 'p'}: not a list of {size}")
    return value


def _number(value: Any, low: float, high: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CostStateError("malformed", f"{what}: not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CostStateError("non_finite", f"{what}: {value}")
    if not low <= value <= high:  # exact for ints of any size: no float overflow
        raise CostStateError("out_of_range", f"{what}: {_shown(value)} not in [{low:g}, {high:g}]")
    return float(value)


def _count(value: Any, low: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CostStateError("malformed", f"{what}: not an integer")
    if not low <= value <= MAX_OBSERVATIONS:
        raise CostStateError("out_of_range", f"{what}: {_shown(value)} not in [{low}, 2^53]")
    return value


def _shown(value: float) -> str:
    return (f"{value:.3g}" if isinstance(value, float) else str(value))[:24]
