"""A run's summary (client side and engine side), the comparison table, JSON and PNG.

Latencies are measured in wall time; the table shows them in model time (wall × time
scale, the time the simulated GPU would take), the JSON keeps both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.engine_stats import EngineCounters, engine_ttft_mean_s, hit_rate
from bench.harness.streaming import RequestRecord
from bench.results_io import figure, have_matplotlib, log_axis, percentile, plot_cdf


@dataclass(frozen=True, slots=True)
class RunSummary:
    policy: str
    requests: int
    errors: int
    duration_s: float
    """Wall seconds from the first request sent to the last answer received."""
    time_scale: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    engine_ttft_mean_s: float
    """The engines' own TTFT (queue to first token), from their /metrics; the difference to
    `ttft_mean_s` is what the gateway, HTTP and the load generator add (wall)."""
    e2e_p50_s: float
    e2e_p90_s: float
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    hit_rate: float
    """Engine side: prefix-cache hit tokens / queried tokens, summed over the engines."""
    client_cached_fraction: float
    """Client side: cached prompt tokens reported in `usage` / prompt tokens."""
    engine_requests: dict[str, int] = field(default_factory=dict)
    engine_hit_rates: dict[str, float] = field(default_factory=dict)
    first_errors: list[str] = field(default_factory=list)
    loop_lag_ms: dict[str, float] = field(default_factory=dict)
    """How late the demo process's event loop (gateway + load generator) ran a 10 ms timer."""
    cpu_cores: dict[str, float] = field(default_factory=dict)
    """Cores busy during the run: the demo process, the engine process."""

    def model(self, wall_seconds: float) -> float:
        return wall_seconds * self.time_scale

    def as_json(self, records: Sequence[RequestRecord]) -> dict[str, Any]:
        scale = self.time_scale
        document = asdict(self)
        document["model_time"] = {
            "ttft_p50_ms": self.ttft_p50_s * scale * 1e3,
            "ttft_p90_ms": self.ttft_p90_s * scale * 1e3,
            "ttft_p99_ms": self.ttft_p99_s * scale * 1e3,
            "e2e_p50_ms": self.e2e_p50_s * scale * 1e3,
            "e2e_p90_ms": self.e2e_p90_s * scale * 1e3,
            "requests_per_s": self.requests_per_s / scale,
            "output_tokens_per_s": self.output_tokens_per_s / scale,
        }
        document["records"] = [
            {"session": r.conversation, "turn": r.turn, "pod": r.pod, "status": r.status or 0,
             "error": r.error, "ttft_s": r.ttft_s, "e2e_s": r.e2e_s,
             "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
             "completion_tokens": r.completion_tokens, "started": r.started,
             "finished": r.ended}
            for r in records
        ]  # fmt: skip
        return document


def summarize(
    policy: str,
    records: Sequence[RequestRecord],
    engines: Mapping[str, EngineCounters],
    time_scale: float,
    loop_lag_ms: Mapping[str, float] | None = None,
    cpu_cores: Mapping[str, float] | None = None,
) -> RunSummary:
    ok = [r for r in records if r.error is None and r.ttft_s is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2es = [r.e2e_s for r in ok]
    duration = max(r.ended for r in records) - min(r.started for r in records) if records else 0.0
    prompt = sum(r.prompt_tokens for r in ok)
    return RunSummary(
        policy=policy,
        requests=len(records),
        errors=len(records) - len(ok),
        duration_s=duration,
        time_scale=time_scale,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        ttft_p99_s=percentile(ttfts, 99),
        ttft_mean_s=sum(ttfts) / len(ttfts) if ttfts else float("nan"),
        engine_ttft_mean_s=engine_ttft_mean_s(engines),
        e2e_p50_s=percentile(e2es, 50),
        e2e_p90_s=percentile(e2es, 90),
        requests_per_s=len(ok) / duration if duration > 0 else 0.0,
        output_tokens_per_s=sum(r.completion_tokens for r in ok) / duration if duration else 0.0,
        prompt_tokens=prompt,
        hit_rate=hit_rate(engines),
        client_cached_fraction=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        engine_requests={name: round(c.requests) for name, c in sorted(engines.items())},
        engine_hit_rates={
            name: c.hits / c.queries if c.queries else 0.0 for name, c in sorted(engines.items())
        },
        first_errors=[r.error for r in records if r.error is not None][:3],
        loop_lag_ms=dict(loop_lag_ms or {}),
        cpu_cores=dict(cpu_cores or {}),
    )


def _ms(summary: RunSummary, seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{summary.model(seconds) * 1e3:,.0f} ms"


def _lower(before: float, after: float) -> str:
    if math.isnan(before) or math.isnan(after) or after <= 0:
        return ""
    ratio = before / after
    return f"{ratio:.1f}× lower" if ratio >= 1 else f"{1 / ratio:.1f}× higher"


def _share(summary: RunSummary) -> str:
    total = sum(summary.engine_requests.values()) or 1
    return " / ".join(f"{n / total:.0%}" for n in summary.engine_requests.values())


def table_rows(base: RunSummary, best: RunSummary) -> list[tuple[str, str, str, str]]:
    """(figure, round-robin, prefix-cache, change) rows of the comparison table."""
    scale = base.time_scale
    rows = [
        ("requests (errors)", f"{base.requests} ({base.errors})",
         f"{best.requests} ({best.errors})", ""),
        ("prompt-cache hit rate", f"{base.hit_rate:.0%}", f"{best.hit_rate:.0%}",
         f"{base.hit_rate:.0%} → {best.hit_rate:.0%}"),
    ]  # fmt: skip
    for label, attr in (("TTFT p50", "ttft_p50_s"), ("TTFT p90", "ttft_p90_s"),
                        ("TTFT p99", "ttft_p99_s"), ("end-to-end p50", "e2e_p50_s"),
                        ("end-to-end p90", "e2e_p90_s")):  # fmt: skip
        before, after = getattr(base, attr), getattr(best, attr)
        rows.append((label, _ms(base, before), _ms(best, after), _lower(before, after)))
    before_rps, after_rps = base.requests_per_s / scale, best.requests_per_s / scale
    change = f"{after_rps / before_rps:.2f}×" if before_rps > 0 else ""
    rows.append(("throughput (req/s)", f"{before_rps:.2f}", f"{after_rps:.2f}", change))
    rows.append(("output tokens/s", f"{base.output_tokens_per_s / scale:,.0f}",
                 f"{best.output_tokens_per_s / scale:,.0f}", ""))  # fmt: skip
    rows.append(("requests per engine", _share(base), _share(best), ""))
    rows.append(
        ("wall time of the run", f"{base.duration_s:.1f} s", f"{best.duration_s:.1f} s", "")
    )
    return rows


def format_table(base: RunSummary, best: RunSummary) -> str:
    header = ("", base.policy, best.policy, "change")
    rows = [header, *table_rows(base, best)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in (1, 2)]
        lines.append("  ".join([*cells, row[3]]).rstrip())
        if index == 0:
            lines.append("-" * (sum(widths) + 6))
    lines.append(
        f"latencies and rates in model time (wall × time scale {base.time_scale:g}); "
        "hit rate from the engines' own /metrics"
    )
    added = [
        f"{s.policy} {(s.ttft_mean_s - s.engine_ttft_mean_s) * 1e3:.1f} ms" for s in (base, best)
    ]
    lines.append(f"added by gateway + HTTP + client to the mean TTFT (wall): {', '.join(added)}")
    return "\n".join(lines)


def headline(base: RunSummary, best: RunSummary) -> str:
    ratio = _lower(base.ttft_p90_s, best.ttft_p90_s) or "n/a"
    return f"TTFT p90 {ratio}, hit rate {base.hit_rate:.0%} → {best.hit_rate:.0%}"


def plot(path: Path, runs: Sequence[tuple[RunSummary, Sequence[RequestRecord]]]) -> bool:
    if not have_matplotlib():  # the `bench` extra is not installed
        return False
    from matplotlib import ticker

    with figure(path, 1, 2, figsize=(11, 4.5), dpi=110) as (fig, (cdf, bars)):
        for summary, records in runs:
            ttfts = [summary.model(r.ttft_s) * 1e3 for r in records if r.ttft_s is not None]
            if ttfts:
                plot_cdf(cdf, ttfts, summary.policy)
        log_axis(cdf, "time to first token (CDF)", "TTFT, model ms (log)", "fraction of requests")
        cdf.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:,.0f}"))
        cdf.xaxis.set_minor_formatter(ticker.NullFormatter())
        names = [summary.policy for summary, _ in runs]
        rates = [summary.hit_rate * 100 for summary, _ in runs]
        bars.bar(names, rates, color=["tab:blue", "tab:orange"][: len(names)])
        for index, rate in enumerate(rates):
            bars.text(index, rate + 1, f"{rate:.0f}%", ha="center")
        bars.set_ylim(0, 105)
        bars.set_ylabel("prompt tokens served from cache, %")
        bars.set_title("prompt-cache hit rate (engines)")
        fig.suptitle("kvgate demo: round-robin vs prefix-cache routing")
    return True
