"""The tables of the component benchmarks (indexer, decoder, simulator, subscriber, gateway
overhead, routing decision, chaos, soak, pinning, demo), each from its committed JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.indexer_bench import TARGETS as INDEXER_TARGETS
from bench.tables.markdown import num, pct, ranged, table


def load(results: Path, name: str) -> Any:
    return json.loads((results / name).read_text())


def _target(key: str, value: float) -> str:
    if key not in INDEXER_TARGETS:
        return "—"
    op, goal = INDEXER_TARGETS[key]
    ok = value >= goal if op == ">=" else value <= goal
    return f"{op.replace('>=', '≥').replace('<=', '≤')} {goal:,} {'✓' if ok else '✗'}"


def indexer(results: Path) -> str:
    d = load(results, "indexer.json")
    c = d["config"]
    rows = [
        ("fleet", f"{c['pods']} pods × {c['blocks_per_pod']:,} blocks = {c['pairs']:,} "
         f"(block, pod) pairs; {'compiled' if c['compiled'] else 'pure-Python'} index", "—"),
    ]  # fmt: skip
    figures = [
        ("ingest_blocks_per_s", "ingest, blocks/s (kvgate's GC setting)", 0),
        ("ingest_blocks_per_s_default_gc", "ingest, blocks/s (CPython's default GC)", 0),
        ("remove_blocks_per_s", "removal, blocks/s", 0),
        ("match_p50_us", "match p50, 8 candidates (µs)", 1),
        ("match_p99_us", "match p99, 8 candidates (µs)", 1),
        ("match_p50_us_64", "match p50, 64 candidates (µs)", 1),
        ("match_p99_us_64", "match p99, 64 candidates (µs)", 1),
        ("hash_2048_tokens_p50_us", "hashing a 2,048-token prompt, p50 (µs)", 1),
        ("bytes_per_pair", "bytes per (block, pod) pair", 1),
    ]
    for key, label, digits in figures:
        rows.append((f"`{key}`: {label}", num(d[key], digits), _target(key, d[key])))
    return table(["figure", "result", "target"], rows)


def _median_range(figures: dict[str, Any], key: str, digits: int) -> str:
    """A figure's median over the runs, with the range the run recorded."""
    low, high = figures["spread"][key]
    return ranged(figures[key], low, high, lambda v: num(v, digits))


def indexer_vs_dynamo(results: Path) -> str:
    d = load(results, "indexer_vs_dynamo.json")
    rows = []
    for workers in ("workers_8", "workers_64"):
        w = d[workers]
        n = workers.split("_")[1]
        for figure, label, digits in (
            ("ingest", "ingest, blocks/s", 0),
            ("remove", "removal, blocks/s", 0),
            ("match_p50", "match p50 (µs)", 1),
        ):
            kv, dyn = (_median_range(w, f"{who}_{figure}", digits) for who in ("kvgate", "dynamo"))
            ratio = w[f"kvgate_{figure}"] / w[f"dynamo_{figure}"]
            rows.append((f"{label}, {n} workers", kv, dyn, f"{ratio:.2f}"))
    memory = d["workers_64"]["memory"]
    rows.append((
        "bytes per (block, pod) pair, 64 workers", num(memory["kvgate_bytes_per_pair"], 1),
        num(memory["dynamo_bytes_per_pair"], 1), f"{d['bytes_per_pair_ratio']:.2f}",
    ))  # fmt: skip
    rows.append((
        "hashing a 2,048-token prompt, p50 (µs)", num(d["kvgate_hash_2048_tokens_p50_us"], 1),
        num(d["dynamo_hash_2048_tokens_p50_us"], 1), f"{d['hash_ratio']:.2f}",
    ))  # fmt: skip
    churn = d["churn"]
    rows.append((
        f"churn: {churn['stored_blocks']:,} stored, {churn['removed_blocks']:,} "
        "evicted, blocks/s", _median_range(churn, "kvgate_blocks_per_s", 0),
        _median_range(churn, "dynamo_blocks_per_s", 0), f"{d['churn_ratio']:.2f}",
    ))  # fmt: skip
    rows.append(("same answers to every query", str(d["answers_equal"]).lower(), "", ""))
    return table(["figure (median of 4 alternated runs, range)", "kvgate", "Dynamo", "ratio"], rows)


def decoder(results: Path) -> str:
    d = load(results, "decoder_fuzz.json")
    reasons = ", ".join(f"{k} {v:,}" for k, v in d["rejected_by_reason"].items())
    rows = [
        ("fuzz cases (10 mutators) / crashes", f"{d['cases']:,} / {d['crashes']}"),
        ("accepted / rejected by reason", f"{d['accepted']:,} / {reasons}"),
        ("decode: batches/s, events/s, MB/s", f"{num(d['decode_batches_per_s'])}, "
         f"{num(d['decode_events_per_s'])}, {num(d['decode_mb_per_s'], 1)}"),
        ("`msgpack.unpackb` alone, batches/s", num(d["unpackb_batches_per_s"])),
    ]  # fmt: skip
    return table(["figure", "result"], rows)


def fuzz(results: Path) -> str:
    d = load(results, "frame_fuzz.json")
    rows = [
        ("frames per pod × pods", f"{d['frames_per_pod']:,} × {len(d['pods'])}"),
        ("crashes", str(d["crashes"])),
        ("index equal to the applied frames' truth", str(d["index_equal"]).lower()),
        ("frames/s through the live subscriber", num(d["frames_per_s"])),
    ]
    return table(["figure", "result"], rows)


def sim(results: Path) -> str:
    r = load(results, "sim.json")["result"]
    rows = [
        ("requests/s at concurrency " + str(r["concurrency"]), num(r["requests_per_s"], 1)),
        ("event batches/s / events/s", f"{num(r['batches_per_s'], 1)} / {num(r['events_per_s'])}"),
        ("latency p50 / p99 (wall ms)", f"{r['latency_p50_ms']:.0f} / {r['latency_p99_ms']:.0f}"),
        ("prompt tokens (mean), cached share", f"{r['prompt_tokens_mean']:.0f}, "
         f"{pct(r['cached_token_ratio'])}"),
        ("encode + publish alone, events/s", num(r["publisher_events_per_s"])),
    ]  # fmt: skip
    return table(["figure", "result"], rows)


def subscriber(results: Path) -> str:
    d = load(results, "subscriber.json")
    caught = d["ingest_pod_caught_up_s"].values()
    rows = [
        ("burst ingest: events/s (batches/s, block hashes/s)",
         f"{num(d['ingest_events_per_s'])} ({num(d['ingest_batches_per_s'])}, "
         f"{num(d['ingest_blocks_per_s'])})"),
        ("events per subscriber CPU-second", num(d["ingest_events_per_cpu_s"])),
        ("live publishing: events/s", num(d["live_events_per_s"])),
        ("event-loop stall, max (burst / live, ms)",
         f"{d['ingest_event_loop_max_stall_ms']:.0f} / {d['live_event_loop_max_stall_ms']:.0f}"),
        ("index equal to the engines' caches", str(d["index_equals_engines"]).lower()),
        (f"gap recovery p50 / max ({d['config']['gap_batches']} batches dropped, "
         f"{d['config']['gap_rounds']} rounds, ms)",
         f"{d['gap_recovery_p50_ms']:.1f} / {d['gap_recovery_max_ms']:.1f}"),
        ("replay buffer overrun: back to live (ms), stale blocks",
         f"{d['overrun_recovery_ms']:.1f}, {d['overrun_stale_blocks']}"),
        (f"{d['engines']} equal backlogs caught up, first / last (s)",
         f"{min(caught):.2f} / {max(caught):.2f}"),
    ]  # fmt: skip
    return table(["figure", "result"], rows)


def decision(results: Path) -> str:
    d = load(results, "decision.json")
    rows = [
        (f"`{name}`", f"{p['p50_us']:.0f} / {p['p99_us']:.0f}",
         f"{p['route_p50_us']:.0f} / {p['route_p99_us']:.0f}")
        for name, p in d["policies"].items()
    ]  # fmt: skip
    head = f"policy ({d['pods']} pods, {d['requests']:,} requests)"
    return table([head, "decision p50 / p99 (µs)", "whole route p50 / p99 (µs)"], rows)


def chaos(results: Path) -> str:
    d = load(results, "chaos/chaos.json")
    f, c, m = d["faults"], d["clients"], d["memory"]
    causes = ", ".join(f"{k} {v}" for k, v in c["failed_by_cause"].items())
    rows = [
        ("faults (kinds × each)", f"{f['faults']} ({len(f['faults_by_kind'])} × "
         f"{f['faults'] // len(f['faults_by_kind'])})"),
        ("converged by themselves / not", f"{f['converged']} / {f['not_converged']}"),
        ("divergent blocks after convergence", str(f["divergent_blocks_after_convergence"])),
        ("convergence p50 / max (s)",
         f"{f['convergence_p50_s']:.2f} / {f['convergence_max_s']:.2f}"),
        ("replay overruns: degraded / phantom blocks / healed",
         f"{f['degraded']['faults']} / {f['degraded']['phantom_blocks']} / "
         f"{f['degraded']['healed_converged']}"),
        ("client requests / failed (by cause)", f"{c['requests']:,} / {c['failed']} ({causes})"),
        ("failures not explained by a fault", str(c["failed_unexpected"])),
        ("gateway RSS, max (MB)", f"{m['rss_mb_max']:.0f}"),
    ]  # fmt: skip
    return table(["figure", "result"], rows)


def soak(results: Path) -> str:
    d = load(results, "soak/soak.json")
    rows = [
        ("capacity / offered / achieved (requests/s)",
         f"{d['capacity_rps']:.1f} / {d['offered_rps']:.1f} / {d['achieved_rps']:.1f}"),
        ("requests / lost", f"{d['requests']:,} / {d['lost_requests']}"),
        ("latency p50 / p99 (ms)", f"{d['latency_p50_ms']:.0f} / {d['latency_p99_ms']:.0f}"),
        ("gateway RSS first / last (MB); slope after warm-up (MB/min)",
         f"{d['rss_mb_first']:.0f} / {d['rss_mb_last']:.0f}; {d['rss_slope_mb_per_min']:+.2f}"),
        ("open fds / asyncio tasks, slope (per min)",
         f"{d['open_fds_slope_per_min']:+.2f} / {d['asyncio_tasks_slope_per_min']:+.2f}"),
        ("index equal to the engines at the end (divergent blocks)",
         f"{str(d['final_whole']).lower()} ({d['final_divergent_blocks']})"),
    ]  # fmt: skip
    return table(["figure", "result"], rows)


def pin_depth(results: Path) -> str:
    d = load(results, "pin-depth/results.json")
    rows = [
        (str(s["depth"]), f"{s['prompt_tokens']:,}", f"{s['ttft_baseline_ms']:,.0f}",
         f"{s['ttft_pinned_ms']:,.0f}", f"{s['speedup']:.1f}×", f"{s['cached_pinned_pct']:.0f} %")
        for s in d["summary"]
    ]  # fmt: skip
    head = ["depth (turns)", "prompt tokens", "TTFT, unpinned (ms)", "TTFT, pinned (ms)"]
    return table([*head, "speed-up", "cached, pinned"], rows)


def demo(results: Path) -> str:
    d = load(results, "demo/demo.json")
    runs = list(d["runs"].values())
    scale_ms = d["time_scale"] * 1000

    def row(label: str, cell: Any) -> tuple[str, ...]:
        return (label, *(cell(r) for r in runs))

    def shares(r: dict[str, Any]) -> str:
        counts = list(r["engine_requests"].values())
        return " / ".join(f"{c / sum(counts) * 100:.0f}" for c in counts) + " %"

    rows = [
        row("prompt-cache hit rate", lambda r: pct(r["hit_rate"], 0)),
        *(row(f"TTFT {p} (ms)", lambda r, p=p: f"{r[f'ttft_{p}_s'] * scale_ms:,.0f}")
          for p in ("p50", "p90", "p99")),
        row("end-to-end p50 (ms)", lambda r: f"{r['e2e_p50_s'] * scale_ms:,.0f}"),
        row("throughput (requests/s)", lambda r: f"{r['requests_per_s'] / d['time_scale']:.2f}"),
        row("requests per engine", shares),
    ]  # fmt: skip
    return table(["", *(f"`{r['policy']}`" for r in runs)], rows)
