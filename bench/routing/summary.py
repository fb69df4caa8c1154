"""One run's figures: client side (from the load generator's records) and engine side
(from each engine's own `/metrics`, read before and after the run).

Latencies are measured in wall time and reported in model time (wall × time scale, the
time the modelled GPU would take); rates likewise per model second.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.harness.engine_stats import EngineCounters, hit_rate
from bench.harness.streaming import RequestRecord
from bench.results_io import percentile


@dataclass(frozen=True, slots=True)
class RunResult:
    workload: str
    router: str
    load: float | None
    """Offered load as a fraction of the fleet's ideal capacity (None: closed loop)."""
    rate_rps: float
    """Offered requests per model second (open loop; 0 for closed loop)."""
    requests: int
    errors: int
    ttft_ms: dict[str, float]
    """p50 / p90 / p99 / mean, model ms."""
    itl_ms: dict[str, float]
    """p50 / p90 over requests of each request's mean inter-token gap, model ms."""
    e2e_ms: dict[str, float]
    throughput_rps: float
    """Answered requests per model second, first request sent to last answer received."""
    output_tokens_per_s: float
    hit_rate: float
    """Engines: prompt tokens served from the prefix cache / prompt tokens looked up."""
    client_cached_fraction: float
    engine_share: dict[str, float]
    """Each engine's share of the requests it finished."""
    imbalance: float
    """Busiest engine's requests / the mean per engine (1.0 = perfectly even)."""
    by_tag: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per traffic class: requests, TTFT p50 / p90 (model ms)."""
    duration_s: float = 0.0
    """Wall seconds of the run."""
    first_errors: list[str] = field(default_factory=list)
    cpu_cores: dict[str, float] = field(default_factory=dict)
    """Cores busy during the run: the engine processes together, the router process."""
    router_cpu_ms_per_request: float = math.nan
    """The router process's CPU time per request (on shared cores it is everyone's TTFT)."""
    replicas: int = 1
    """Gateway replicas in front of the fleet (kvgate's policies; requests spread over them
    one by one); 1 for every other router."""
    replica_sync: bool = False
    """Whether the replicas shared their decisions (KVGATE_REPLICA_PEERS)."""
    replica_sync_cpu_share: float | None = None
    """Replicas sharing decisions: the channel's CPU (`kvgate_replica_sync_cpu_seconds_total`)
    over the replicas' whole CPU (`process_cpu_seconds_total`), summed over replicas."""
    replica_kill: dict[str, Any] = field(default_factory=dict)
    """`--kill-replica`: one replica killed under load and replaced (failover.py)."""
    round: int = 0
    """Which repetition of the routers this run was (`--repeat`: 0, 1, ...; the routers'
    order alternates from one to the next)."""
    prediction: dict[str, float] = field(default_factory=dict)
    """How well kvgate predicted each request's TTFT (absent for routers that do not):
    `n`, `abs_err_ms_p50` / `_p90` (model ms), `rel_err_p50` / `_p90` (|error| /
    observed), `bias_ms_p50` (observed − predicted). Observed: the load generator's TTFT
    (first generated text); predicted: the gateway's, to the engine's first byte."""
    tpot_met: float | None = None
    """With `--slo-tpot-ms`: the share of answers (of two tokens or more) whose mean
    inter-token gap met it."""
    trace_speed: float | None = None
    """A replayed trace: how many times faster than recorded it was sent."""
    real_engines: bool = False
    """Served by real vLLM engines (on CPU), not simulated ones."""
    engine_prompt_share: dict[str, float] = field(default_factory=dict)
    """Each engine's share of the prompt tokens (what it was asked to serve, cached or
    not)."""
    pick_ms: dict[str, float] = field(default_factory=dict)
    """Through the endpoint picker: p50 / p90 / p99 / mean of the time from the send to
    the endpoint named (each record's `pick_s`), model ms, a part of the TTFT; empty for a
    proxy."""
    via: str = "proxy"
    """How the load reached the engines (`--mode`): `proxy`, through the router; `epp`,
    picked by `kvgate epp` over ext_proc and sent straight to the engine, as Envoy does."""

    @property
    def label(self) -> str:
        """The router as tables and plots name it (`prefix-cache ×3` for 3 replicas sharing
        their decisions, `prefix-cache ×3 indep.` for 3 that do not; `prefix-cache@epp`
        through the endpoint picker)."""
        name = self.router if self.via == "proxy" else f"{self.router}@{self.via}"
        if self.replicas == 1:
            return name
        return f"{name} ×{self.replicas}" + ("" if self.replica_sync else " indep.")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


def _stats(values: Sequence[float], scale_ms: float) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p90": math.nan, "p99": math.nan, "mean": math.nan}
    return {
        "p50": percentile(values, 50) * scale_ms,
        "p90": percentile(values, 90) * scale_ms,
        "p99": percentile(values, 99) * scale_ms,
        "mean": sum(values) / len(values) * scale_ms,
    }


def summarize(
    *,
    workload: str,
    router: str,
    load: float | None,
    rate_rps: float,
    records: Sequence[RequestRecord],
    engines: Mapping[str, EngineCounters],
    time_scale: float,
    slo_tpot_ms: float | None = None,
    trace_speed: float | None = None,
    real_engines: bool = False,
) -> RunResult:
    ok = [r for r in records if r.error is None and r.ttft_s is not None]
    scale_ms = time_scale * 1e3
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    if records:
        first = min(r.started for r in records)
        last = max(r.ended for r in records)
        duration = last - first
    else:
        duration = 0.0
    model_duration = duration * time_scale
    prompt = sum(r.prompt_tokens for r in ok)
    finished = {name: c.requests for name, c in sorted(engines.items())}
    total = sum(finished.values())
    share = {name: n / total if total else 0.0 for name, n in finished.items()}
    mean = total / len(finished) if finished else 0.0
    prompts = {name: c.queries for name, c in sorted(engines.items())}
    prompt_total = sum(prompts.values())
    by_tag: dict[str, dict[str, float]] = {}
    for tag in sorted({r.tag for r in records}):
        tagged = [r.ttft_s for r in ok if r.tag == tag and r.ttft_s is not None]
        stats = _stats(tagged, scale_ms)
        by_tag[tag] = {"requests": len(tagged), "ttft_p50": stats["p50"], "ttft_p90": stats["p90"]}
    return RunResult(
        workload=workload,
        router=router,
        load=load,
        rate_rps=rate_rps,
        requests=len(records),
        errors=len(records) - len(ok),
        ttft_ms=_stats(ttfts, scale_ms),
        itl_ms=_stats([r.itl_s for r in ok if r.itl_s is not None], scale_ms),
        e2e_ms=_stats([r.e2e_s for r in ok], scale_ms),
        throughput_rps=len(ok) / model_duration if model_duration > 0 else 0.0,
        output_tokens_per_s=(
            sum(r.completion_tokens for r in ok) / model_duration if model_duration else 0.0
        ),
        hit_rate=hit_rate(engines),
        client_cached_fraction=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        engine_share=share,
        imbalance=max(finished.values()) / mean if mean else math.nan,
        by_tag=by_tag,
        duration_s=duration,
        first_errors=[r.error for r in records if r.error is not None][:3],
        prediction=_prediction(ok, scale_ms),
        pick_ms=_stats(picks, scale_ms) if (picks := [r.pick_s for r in ok if r.pick_s]) else {},
        tpot_met=None if slo_tpot_ms is None else _met(ok, slo_tpot_ms / scale_ms),
        trace_speed=trace_speed,
        real_engines=real_engines,
        engine_prompt_share={
            name: n / prompt_total if prompt_total else 0.0 for name, n in prompts.items()
        },
    )


def _met(ok: Sequence[RequestRecord], slo_s: float) -> float:
    """Of the answers with a mean inter-token gap (two text chunks or more), the share
    whose gap was within `slo_s`."""
    gaps = [r.itl_s for r in ok if r.itl_s is not None]
    return sum(gap <= slo_s for gap in gaps) / len(gaps) if gaps else math.nan


def _prediction(ok: Sequence[RequestRecord], scale_ms: float) -> dict[str, float]:
    pairs = [
        (r.ttft_s, r.predicted_ttft_s)
        for r in ok
        if r.predicted_ttft_s is not None and r.ttft_s is not None and r.ttft_s > 0
    ]
    if not pairs:
        return {}
    figures = _errors(pairs, scale_ms)
    figures["n"] = float(len(pairs))
    # time per output token: the client's mean gap between text chunks against kvgate's
    # prediction for the pod (`x-kvgate-predicted-tpot-ms`)
    tpots = [
        (r.itl_s, r.predicted_tpot_s)
        for r in ok
        if r.predicted_tpot_s is not None and r.itl_s is not None and r.itl_s > 0
    ]
    if tpots:
        figures |= {f"tpot_{key}": value for key, value in _errors(tpots, scale_ms).items()}
        figures["tpot_n"] = float(len(tpots))
    return figures


def _errors(pairs: Sequence[tuple[float, float]], scale_ms: float) -> dict[str, float]:
    """|observed − predicted| (model ms and relative to the observed) and the bias."""
    absolute = [abs(observed - predicted) for observed, predicted in pairs]
    relative = [abs(observed - predicted) / observed for observed, predicted in pairs]
    bias = [observed - predicted for observed, predicted in pairs]
    return {
        "abs_err_ms_p50": percentile(absolute, 50) * scale_ms,
        "abs_err_ms_p90": percentile(absolute, 90) * scale_ms,
        "rel_err_p50": percentile(relative, 50),
        "rel_err_p90": percentile(relative, 90),
        "bias_ms_p50": percentile(bias, 50) * scale_ms,
    }


def median_of(runs: Sequence[RunResult]) -> RunResult:
    """One router's repeated runs (`--repeat`) as one result: the median of each figure,
    per key for the dict figures (tags and engines alike); the errors summed, so that a
    failure in any run shows."""
    first = runs[0]
    if len(runs) == 1:
        return first
    merged: dict[str, Any] = {}
    for name in first.__dataclass_fields__:
        values = [getattr(run, name) for run in runs]
        merged[name] = _median_value(values)
    merged["errors"] = sum(run.errors for run in runs)
    merged["first_errors"] = [e for run in runs for e in run.first_errors][:3]
    merged["round"] = -1
    return RunResult(**merged)


def spread_of(runs: Sequence[RunResult]) -> dict[str, list[float]]:
    """[lowest, highest] over a router's repeated runs of its TTFT p50 / p90 / p99, hit rate
    and prediction |error| p90, and of each traffic class's TTFT p90 when there are several
    (`<tag>_ttft_p90`)."""
    figures: dict[str, list[float]] = {
        "ttft_p50": [r.ttft_ms["p50"] for r in runs],
        "ttft_p90": [r.ttft_ms["p90"] for r in runs],
        "ttft_p99": [r.ttft_ms["p99"] for r in runs],
        "hit_rate": [r.hit_rate for r in runs],
        "rel_err_p90": [r.prediction["rel_err_p90"] for r in runs if r.prediction],
    }
    tags = sorted({tag for r in runs for tag in r.by_tag}) if len(runs[0].by_tag) > 1 else []
    for tag in tags:
        figures[f"{tag}_ttft_p90"] = [r.by_tag[tag]["ttft_p90"] for r in runs if tag in r.by_tag]
    return {name: [min(v), max(v)] for name, v in figures.items() if v}


def _median_value(values: Sequence[Any]) -> Any:
    first = values[0]
    if isinstance(first, bool | str) or first is None:
        return first
    if isinstance(first, int | float):
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        middle = statistics.median(numbers)
        return round(middle) if isinstance(first, int) else middle
    if isinstance(first, dict):
        keys = [k for k in first if all(isinstance(v, dict) and k in v for v in values)]
        return {k: _median_value([v[k] for v in values]) for k in keys}
    return first
