"""The subscriber bench's output: the table on stdout and the ingest/recovery plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.results_io import figure, print_table
from bench.subscriber_load.gateway import Gateway


def report(results: dict[str, Any]) -> None:
    config = results["config"]
    counters = results["ingest_subscriber_counters"]
    r = results
    ingest_share = r["ingest_cpu_s"] / r["ingest_wall_s"]
    live_share = r["live_cpu_s"] / r["live_wall_s"]
    caught_up = list(r["ingest_pod_caught_up_s"].values())
    overrun = f"gap {config['overrun_gap_batches']} > buffer {config['overrun_buffer']}"
    rows = [
        ("burst: prepared batches sent back to back", "", ""),
        (
            "ingest_events_per_s",
            f"{r['ingest_events_per_s']:,.0f} events/s",
            "first send → caught up",
        ),
        ("ingest_batches_per_s", f"{r['ingest_batches_per_s']:,.0f} batches/s", ""),
        ("ingest_blocks_per_s", f"{r['ingest_blocks_per_s']:,.0f} blocks/s", "hashes in events"),
        ("ingest_events_per_cpu_s", f"{r['ingest_events_per_cpu_s']:,.0f} events/s", "per CPU s"),
        (
            "subscriber_cpu_s",
            f"{r['subscriber_cpu_s']:.2f} s",
            f"{ingest_share:.0%} of a core over {r['ingest_wall_s']:.1f} s",
        ),
        ("ingest_event_loop_max_stall_ms", f"{r['ingest_event_loop_max_stall_ms']:.0f} ms", ""),
        (
            "1 % of batches applied after",
            f"{r['ingest_first_percent_applied_s']:.2f} s",
            f"sending took {r['ingest_publish_s']:.2f} s",
        ),
        (
            "pods caught up after (first / last)",
            f"{min(caught_up):.2f} / {max(caught_up):.2f} s",
            "same backlog each",
        ),
        (
            "replays / gaps / live_dropped",
            f"{counters['replays']} / {counters['gaps']} / {counters['live_dropped']}",
            "subscriber counters",
        ),
        ("live: engines step the sim cache and publish", "", ""),
        ("live_events_per_s", f"{r['live_events_per_s']:,.0f} events/s", "steady window"),
        (
            "live_cpu_s",
            f"{r['live_cpu_s']:.2f} s",
            f"{live_share:.0%} of a core over {r['live_wall_s']:.1f} s",
        ),
        ("live_event_loop_max_stall_ms", f"{r['live_event_loop_max_stall_ms']:.0f} ms", ""),
        ("correctness and recovery", "", ""),
        ("index_equals_engines", str(r["index_equals_engines"]), "table.dump == resident set"),
        (
            "gap_recovery_p50_ms",
            f"{r['gap_recovery_p50_ms']:.1f} ms",
            f"{config['gap_batches']} batches dropped",
        ),
        (
            "gap_recovery_max_ms",
            f"{r['gap_recovery_max_ms']:.1f} ms",
            f"{config['gap_rounds']} rounds",
        ),
        ("overrun_recovery_ms", f"{r['overrun_recovery_ms']:.1f} ms", overrun),
        (
            "overrun stale / missing blocks",
            f"{r['overrun_stale_blocks']} / {r['overrun_missing_blocks']}",
            f"of {r['overrun_engine_blocks']} held; pod degraded",
        ),
        (
            "  same, after more publishing",
            f"{r['overrun_stale_after_churn']} / {r['overrun_missing_after_churn']}",
            f"of {r['overrun_engine_blocks_after_churn']} held, after "
            f"{r['overrun_churn_batches']} more batches",
        ),
    ]
    print_table(
        f"kvgate subscriber: {config['engines']} engine processes + this subscriber process "
        f"sharing {config['cores']} cores",
        rows,
    )


def plot(path: Path, gateway: Gateway, results: dict[str, Any]) -> bool:
    with figure(path, 3, 1, figsize=(8, 9.5), dpi=120) as (fig, (live, burst, recovery)):
        _plot_phase(live, gateway, "live", "prepare")
        live.set_title(
            f"live: engines step the sim cache and publish "
            f"({results['live_events_per_s']:,.0f} events/s applied)",
            fontsize="medium",
        )
        _plot_phase(burst, gateway, "burst", "gaps")
        burst.set_title(
            f"burst: {results['config']['batches']} prepared batches per engine sent at once "
            f"({results['ingest_events_per_s']:,.0f} events/s applied)",
            fontsize="medium",
        )
        recoveries = results["gap_recovery_ms"]
        recovery.plot(
            range(1, len(recoveries) + 1), recoveries, "o", label="gap, repaired by replay"
        )
        recovery.axhline(
            results["overrun_recovery_ms"],
            color="red",
            linestyle="--",
            label="replay buffer overrun",
        )
        recovery.set_title(
            f"recovery after {results['config']['gap_batches']} batches dropped", fontsize="medium"
        )
        recovery.set_xlabel("gap round")
        recovery.set_ylabel("recovery (ms)")
        recovery.set_ylim(bottom=0)
        recovery.grid(True, alpha=0.3)
        recovery.legend(fontsize="small")
        fig.suptitle(
            f"kvgate subscriber: {results['engines']} engine processes + 1 subscriber process, "
            f"{results['config']['cores']} cores"
        )
    return True


def _plot_phase(axis: Any, gateway: Gateway, first: str, until: str) -> None:
    """Events applied per pod from phase mark `first` to mark `until`, from 0 at its start."""
    marks = {label: at for at, label in gateway.phases}
    start, end = marks[first], marks[until]
    samples = [s for s in gateway.sink.samples if start <= s.at <= end]
    if not samples:
        return
    base = samples[0].events_by_pod
    for pod in sorted(base):
        axis.plot(
            [s.at - start for s in samples],
            [s.events_by_pod.get(pod, 0) - base[pod] for s in samples],
            label=pod,
        )
    axis.set_xlabel(f"seconds since the {first} phase started")
    axis.set_ylabel("events applied to the index")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small")
