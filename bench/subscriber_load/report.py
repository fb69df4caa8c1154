"""The subscriber bench's output: the table on stdout and the ingest/recovery plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.results_io import figure, print_table
from bench.subscriber_load.gateway import Gateway

# (figure, value, note) of the table, formatted with the results (and the figures `report` derives).
_ROWS = (
    ("burst: prepared batches sent back to back", "", ""),
    ("ingest_events_per_s", "{ingest_events_per_s:,.0f} events/s", "first send → caught up"),
    ("ingest_batches_per_s", "{ingest_batches_per_s:,.0f} batches/s", ""),
    ("ingest_blocks_per_s", "{ingest_blocks_per_s:,.0f} blocks/s", "hashes in events"),
    ("ingest_events_per_cpu_s", "{ingest_events_per_cpu_s:,.0f} events/s", "per CPU s"),
    (
        "subscriber_cpu_s",
        "{subscriber_cpu_s:.2f} s",
        "{ingest_share:.0%} of a core over {ingest_wall_s:.1f} s",
    ),
    ("ingest_event_loop_max_stall_ms", "{ingest_event_loop_max_stall_ms:.0f} ms", ""),
    (
        "1 % of batches applied after",
        "{ingest_first_percent_applied_s:.2f} s",
        "sending took {ingest_publish_s:.2f} s",
    ),
    ("pods caught up after (first / last)", "{first:.2f} / {last:.2f} s", "same backlog each"),
    (
        "replays / gaps / live_dropped",
        "{counters[replays]} / {counters[gaps]} / {counters[live_dropped]}",
        "subscriber counters",
    ),
    ("live: engines step the sim cache and publish", "", ""),
    ("live_events_per_s", "{live_events_per_s:,.0f} events/s", "steady window"),
    ("live_cpu_s", "{live_cpu_s:.2f} s", "{live_share:.0%} of a core over {live_wall_s:.1f} s"),
    ("live_event_loop_max_stall_ms", "{live_event_loop_max_stall_ms:.0f} ms", ""),
    ("correctness and recovery", "", ""),
    ("index_equals_engines", "{index_equals_engines}", "table.dump == resident set"),
    (
        "gap_recovery_p50_ms",
        "{gap_recovery_p50_ms:.1f} ms",
        "{config[gap_batches]} batches dropped",
    ),
    ("gap_recovery_max_ms", "{gap_recovery_max_ms:.1f} ms", "{config[gap_rounds]} rounds"),
    (
        "overrun_recovery_ms",
        "{overrun_recovery_ms:.1f} ms",
        "gap {config[overrun_gap_batches]} > buffer {config[overrun_buffer]}",
    ),
    (
        "overrun stale / missing blocks",
        "{overrun_stale_blocks} / {overrun_missing_blocks}",
        "of {overrun_engine_blocks} held; pod degraded",
    ),
    (
        "  same, after more publishing",
        "{overrun_stale_after_churn} / {overrun_missing_after_churn}",
        "of {overrun_engine_blocks_after_churn} held, after {overrun_churn_batches} more batches",
    ),
)


def report(results: dict[str, Any]) -> None:
    caught_up = list(results["ingest_pod_caught_up_s"].values())
    values = {
        **results,
        "counters": results["ingest_subscriber_counters"],
        "ingest_share": results["ingest_cpu_s"] / results["ingest_wall_s"],
        "live_share": results["live_cpu_s"] / results["live_wall_s"],
        "first": min(caught_up),
        "last": max(caught_up),
    }
    config = results["config"]
    print_table(
        f"kvgate subscriber: {config['engines']} engine processes + this subscriber process "
        f"sharing {config['cores']} cores",
        [(name, value.format(**values), note.format(**values)) for name, value, note in _ROWS],
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
