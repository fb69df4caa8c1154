"""The overhead bench's output: the table on stdout, the latency CDF plot, the profile."""

from __future__ import annotations

import pstats
import sys
from pathlib import Path
from typing import Any

from bench.results_io import figure, print_table

TARGETS = {
    "added_p50_ms_c1": ("<=", 1.0),
    "max_rps_gateway": (">=", 1000.0),
    "stream_first_chunk_added_p50_ms": ("<=", 2.0),
}
Samples = dict[str, tuple[list[float], list[float]]]
"""Per case key: the measured milliseconds, direct and via the gateway (or relay)."""


def report(results: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str]] = []
    for key, case in results["cases"].items():
        rows.append((
            f"{key} ({case['policy']}, c={case['concurrency']})",
            f"{case['direct_p50_ms']:.3f} / {case['direct_p99_ms']:.3f} direct",
            f"{case['gateway_p50_ms']:.3f} / {case['gateway_p99_ms']:.3f} ms via {case['via']} "
            f"(p50 / p99{', first chunk' if case['stream'] else ''}); {case['via']} CPU "
            f"{case['gateway_cpu_us_per_request']} us/req; errors {case['errors']}",
        ))  # fmt: skip
    for key, value in results.items():
        if key.startswith(("added_", "stream_", "max_rps", "gateway_cpu")):
            rows.append((key, _value(key, value), _target_note(key, value)))
    rps = results["throughput"]
    for side in ("direct", "gateway"):
        cores = ", ".join(f"{n} {v:.2f}" for n, v in rps[f"{side}_cpu_cores"].items())
        rows.append((f"CPU cores busy, {side} run", cores, _busiest(rps[f"{side}_cpu_cores"])))
    config = results["config"]
    load = config["load_average_before"][0]
    print_table(
        f"kvgate overhead: {config['engines']} engine process(es), 1 gateway process and the "
        f"load generator ({config['client']} client) share {config['cpu_cores']} CPU cores; "
        f"load average {load:.1f} at start"
        + (" (other work was running: figures are noisy)" if load > 1 else "")
        + (" — PROFILED: figures include cProfile's overhead" if config["profiled"] else ""),
        rows,
    )


def _value(key: str, value: float) -> str:
    if key.startswith("max_rps"):
        return f"{value:,.1f} req/s"
    return f"{value} us" if key.startswith("gateway_cpu") else f"{value:.3f} ms"


def _target_note(key: str, value: float) -> str:
    if key not in TARGETS:
        return ""
    op, target = TARGETS[key]
    ok = value >= target if op == ">=" else value <= target
    return f"target {op} {target:g}  {'ok' if ok else 'MISSED'}"


def _busiest(cores: dict[str, float]) -> str:
    name, busy = max(cores.items(), key=lambda item: item[1])
    return f"busiest: {name} ({busy:.0%} of a core)" + (", saturated" if busy > 0.9 else "")


def plot(path: Path, samples: Samples, results: dict[str, Any]) -> None:
    panels = {
        "c1": "round-robin, concurrency 1",
        "c32": "round-robin, concurrency 32",
        "c1_tokenized_distinct": "prefix-cache, c=1, distinct prompts",
        "stream": "time to first streamed chunk, c=1",
    }
    with figure(path, 2, 2, figsize=(11, 7), dpi=110) as (fig, axes):
        for axis, (key, title) in zip(axes.flat, panels.items(), strict=True):
            lines = [("direct", "-", samples[key][0]), ("via gateway", "-", samples[key][1])]
            if key == "c1":
                direct_run, relay = samples["c1_relay"]
                lines.append(("direct (relay run)", "--", direct_run))
                lines.append(("via a byte relay", "--", relay))
            for label, style, values in lines:
                ordered = sorted(values)
                fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
                axis.plot(ordered, fractions, style, label=label)
            axis.set_xscale("log")
            axis.set_xlabel("ms")
            axis.set_ylabel("fraction of requests")
            axis.set_title(title)
            axis.grid(True, which="both", alpha=0.3)
            axis.legend()
        fig.suptitle(
            f"kvgate overhead (latency CDFs); max {results['max_rps_gateway']:,.0f} req/s via the "
            f"gateway, {results['max_rps_direct']:,.0f} direct"
        )


def print_profile(path: Path, top: int = 30) -> None:
    if not path.exists():
        print(f"no gateway profile was written to {path}", file=sys.stderr)
        return
    print(f"\ngateway CPU profile ({path}), top {top} by cumulative time:")
    pstats.Stats(str(path)).sort_stats("cumulative").print_stats(top)
