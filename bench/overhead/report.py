"""The overhead bench's output: the table on stdout, the per-router figures and their
targets, the latency CDF plot, the profile."""

from __future__ import annotations

import pstats
import sys
from pathlib import Path
from typing import Any

from bench.results_io import figure, log_axis, plot_cdf, print_table

TARGETS = {
    "added_p50_ms_c1": ("<=", 1.0),
    "max_rps_gateway": (">=", 1000.0),
    "stream_first_chunk_added_p50_ms": ("<=", 2.0),
}
Samples = dict[str, tuple[list[float], list[float]]]
"""Per case key: the measured milliseconds, direct and via the gateway (or relay)."""
PEER = "sglang-router"
"""The peer the targets compare kvgate with."""
_KVGATE_CASES = {
    "cpu_us_per_request_c1": "c1",
    "cpu_us_per_request_c32": "c32",
    "cpu_us_per_request_c1_tokenized_distinct": "c1_tokenized_distinct",
    "cpu_us_per_request_c32_tokenized_distinct": "c32_tokenized_distinct",
}
_PEER_CASES = {
    "cpu_us_per_request_c1": "c1_{}",
    "cpu_us_per_request_c32": "c32_{}",
    "cpu_us_per_request_c32_distinct": "c32_distinct_{}",
}


def router_figures(results: dict[str, Any], peers: tuple[str, ...]) -> dict[str, Any]:
    """Per router: its process's CPU per non-streamed request (`cpu_us_per_request_*`, the
    cases' figures) and its streaming figures (`stream_*`)."""
    cases, streaming = results["cases"], results["streaming"]["routers"]
    routers: dict[str, Any] = {
        "kvgate": {k: cases[c]["gateway_cpu_us_per_request"] for k, c in _KVGATE_CASES.items()}
    }
    for peer in peers:
        key = peer.replace("-", "_")
        routers[peer] = {
            k: cases[c.format(key)]["gateway_cpu_us_per_request"] for k, c in _PEER_CASES.items()
        }
    for name, figures in streaming.items():
        routers.setdefault(name, {}).update(figures)
    return routers


_TOKENIZER_FIGURES = (
    "added_p50_ms", "added_p99_ms", "gateway_cpu_us_per_request", "engines_cpu_us_per_request",
)  # fmt: skip


def tokenizer_figures(cases: dict[str, Any]) -> dict[str, Any]:
    """Each tokenized case's figures in-process ("local") and at the engines ("remote"),
    side by side: added latency p50 / p99, the gateway's CPU per request, and (c=1) the
    engines' (which pay for a remote tokenization)."""
    pairs: dict[str, Any] = {}
    for key, case in cases.items():
        if not key.endswith("_local") or key.removesuffix("_local") not in cases:
            continue
        remote = cases[key.removesuffix("_local")]
        pairs[key.removesuffix("_local")] = {
            side: {name: figures[name] for name in _TOKENIZER_FIGURES if name in figures}
            for side, figures in (("local", case), ("remote", remote))
        }
    return pairs


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets for kvgate's CPU and streaming figures; `ok` None: not measured."""
    routers = results["routers"]
    kvgate, peer = routers["kvgate"], routers.get(PEER)
    rows: list[dict[str, Any]] = []

    def check(what: str, value: float, limit: float | None, unit: str) -> None:
        ok = None if limit is None else value <= limit
        rows.append({"target": what, "value": value, "limit": limit, "unit": unit, "ok": ok})

    def of_peer(key: str, factor: float) -> float | None:
        return None if peer is None else round(peer[key] * factor, 1)

    rr, pc = "CPU per request, round-robin", "CPU per request, prefix-cache (distinct prompts)"
    check(f"{rr}, c=1 <= {PEER}'s", kvgate["cpu_us_per_request_c1"],
          of_peer("cpu_us_per_request_c1", 1.0), "us")  # fmt: skip
    check(f"{rr}, c=32 <= {PEER}'s", kvgate["cpu_us_per_request_c32"],
          of_peer("cpu_us_per_request_c32", 1.0), "us")  # fmt: skip
    check(f"{pc}, c=1 <= 1.5x {PEER}'s", kvgate["cpu_us_per_request_c1_tokenized_distinct"],
          of_peer("cpu_us_per_request_c1", 1.5), "us")  # fmt: skip
    check(f"{pc}, c=32 <= 1.5x {PEER}'s", kvgate["cpu_us_per_request_c32_tokenized_distinct"],
          of_peer("cpu_us_per_request_c32_distinct", 1.5), "us")  # fmt: skip
    check(f"CPU per 1,000 relayed chunks <= 2x {PEER}'s", kvgate["stream_cpu_ms_per_1k_chunks"],
          of_peer("stream_cpu_ms_per_1k_chunks", 2.0), "ms")  # fmt: skip
    streams = results["streaming"]["config"]["streams"]
    check(f"added TTFT p50, {streams} concurrent streams <= 5 ms",
          kvgate["stream_added_ttft_p50_ms"], 5.0, "ms")  # fmt: skip
    check("added inter-chunk delay p99 <= 2 ms", kvgate["stream_added_itl_p99_ms"], 2.0, "ms")
    return rows


def _interleaved(case: dict[str, Any]) -> str:
    figure = case.get("gateway_cpu_us_per_request_interleaved")
    return "" if figure is None else f" (alternating with direct: {figure})"


def report(results: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str]] = []
    for key, case in results["cases"].items():
        rows.append((
            f"{key} ({case['policy']}, c={case['concurrency']})",
            f"{case['direct_p50_ms']:.3f} / {case['direct_p99_ms']:.3f} direct",
            f"{case['gateway_p50_ms']:.3f} / {case['gateway_p99_ms']:.3f} ms via {case['via']} "
            f"(p50 / p99{', first chunk' if case['stream'] else ''}); {case['via']} CPU "
            f"{case['gateway_cpu_us_per_request']} us/req{_interleaved(case)}; "
            f"errors {case['errors']}",
        ))  # fmt: skip
    for key, value in results.items():
        if key.startswith(("added_", "stream_", "max_rps", "gateway_cpu")):
            rows.append((key, _value(key, value), _target_note(key, value)))
    rps = results["throughput"]
    for side in ("direct", "gateway"):
        cores = ", ".join(f"{n} {v:.2f}" for n, v in rps[f"{side}_cpu_cores"].items())
        rows.append((f"CPU cores busy, {side} run", cores, _busiest(rps[f"{side}_cpu_cores"])))
    for key, sides in results["tokenizers"].items():
        local, remote = sides["local"], sides["remote"]
        rows.append((
            f"tokenizer, {key}: local | remote",
            f"added p50 {local['added_p50_ms']:.3f} | {remote['added_p50_ms']:.3f}, p99 "
            f"{local['added_p99_ms']:.3f} | {remote['added_p99_ms']:.3f} ms",
            f"CPU us/req gateway {local['gateway_cpu_us_per_request']} | "
            f"{remote['gateway_cpu_us_per_request']}"
            + (f", engines {local['engines_cpu_us_per_request']} | "
               f"{remote['engines_cpu_us_per_request']}"
               if "engines_cpu_us_per_request" in local else ""),
        ))  # fmt: skip
    rows += _stream_rows(results["streaming"])
    for name, figures in results["routers"].items():
        cpu = ", ".join(
            f"{k.removeprefix('cpu_us_per_request_')} {v}"
            for k, v in figures.items() if k.startswith("cpu_us")
        )  # fmt: skip
        rows.append((
            f"router {name}",
            f"CPU us/request: {cpu}",
            f"streams: CPU {figures['stream_cpu_ms_per_1k_chunks']} ms per 1k chunks (background "
            f"{figures['stream_background_cpu_ms_per_1k_chunks']}); added "
            f"TTFT p50 / p99 {figures['stream_added_ttft_p50_ms']} / "
            f"{figures['stream_added_ttft_p99_ms']} ms (mean outside the engine "
            f"{figures['stream_added_ttft_outside_engine_mean_ms']}); added inter-chunk p99 "
            f"{figures['stream_added_itl_p99_ms']} ms",
        ))  # fmt: skip
    for name, why in results["config"]["peers_skipped"].items():
        rows.append((f"router {name}", "not installed: skipped", why[:60]))
    missing = (
        f"{PEER} not installed: skipped"
        if PEER in results["config"]["peers_skipped"]
        else f"{PEER} not measured (--peers)"
    )
    for row in results["targets"]:
        mark = {True: "✓", False: "✗", None: "–"}[row["ok"]]
        limit = missing if row["limit"] is None else f"limit {row['limit']:g} {row['unit']}"
        rows.append((f"{mark} {row['target']}", f"{row['value']:g} {row['unit']}", limit))
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


def _stream_rows(streaming: dict[str, Any]) -> list[tuple[str, str, str]]:
    config = streaming["config"]
    rows = []
    for name, side in streaming["targets"].items():
        cpu = side["cpu_ms_per_1k_chunks_by_process"]
        rows.append((
            f"streams {name} ({config['streams']} x {config['tokens_per_stream']} tokens, "
            f"gap ~{config['expected_gap_ms']:g} ms)",
            f"TTFT {side['ttft_p50_ms']:.2f} / {side['ttft_p99_ms']:.2f} (mean outside the "
            f"engine {side['ttft_outside_engine_mean_ms']:.2f}), inter-chunk "
            f"{side['itl_p50_ms']:.2f} / {side['itl_p99_ms']:.2f} ms (p50 / p99)",
            f"{side['chunks']} chunks ({side['engine_chunks']} sent by the engine), failed "
            f"{sum(side['failed_streams'].values())}; CPU ms per 1k chunks: "
            + ", ".join(f"{n} {v}" for n, v in cpu.items()),
        ))  # fmt: skip
    return rows


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


def plot(path: Path, samples: Samples, stream_samples: Samples, results: dict[str, Any]) -> None:
    panels = {
        "c1": "round-robin, concurrency 1",
        "c32": "round-robin, concurrency 32",
        "c1_tokenized_distinct": "prefix-cache, c=1, distinct prompts",
        "stream": "time to first streamed chunk, c=1",
    }
    streaming = results["streaming"]["config"]
    at_once = f"{streaming['streams']} streams at once"
    with figure(path, 3, 2, figsize=(11, 10.5), dpi=110) as (fig, axes):
        for index, title in enumerate((f"TTFT, {at_once}", f"inter-chunk delay, {at_once}")):
            axis = axes[2][index]
            for name, per_kind in stream_samples.items():
                plot_cdf(axis, per_kind[index], name)
            log_axis(axis, title, "ms", f"fraction of {'streams' if index == 0 else 'gaps'}")
        for axis, (key, title) in zip(axes.flat, panels.items(), strict=False):
            lines = [("direct", "-", samples[key][0]), ("via gateway", "-", samples[key][1])]
            if key == "c1":
                direct_run, relay = samples["c1_relay"]
                lines.append(("direct (relay run)", "--", direct_run))
                lines.append(("via a byte relay", "--", relay))
            for label, style, values in lines:
                plot_cdf(axis, values, label, style)
            log_axis(axis, title, "ms", "fraction of requests")
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
