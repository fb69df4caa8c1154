"""Chaos results: which client failures a fault explains, the summary figures, the table
and the PNG timeline."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.chaos.convergence import Convergence
from bench.chaos.faults import FaultRecord
from bench.chaos.sampler import Sample
from bench.harness.streaming import RequestRecord
from bench.results_io import figure, percentile

CONVERGENCE_TARGET_S = 5.0


def attribute_failures(failed: Sequence[RequestRecord], faults: Sequence[FaultRecord]) -> list[str]:
    """For each failed request (in order), which allowed cause explains it, or `unexpected`.

    Allowed: anything in flight or sent while the gateway was down; a *streamed* request
    cut on an engine that was killed, or restarted with its cache wiped (which ends every
    running request, as a real restart does), while it ran; a streamed request cut by its
    engine's armed `close_midstream` (at most as many as were armed, started after the
    arming).
    A non-streamed request must never fail because of an engine: the gateway retries it.
    """
    cuts_left = {
        id(f): int(f.spec.params.get("close_midstream", 0))
        for f in faults
        if f.spec.kind == "close_midstream"
    }
    causes = {}
    for record in sorted(failed, key=lambda r: r.started):
        causes[id(record)] = _cause(record, faults, cuts_left)
    return [causes[id(r)] for r in failed]


def _cause(record: RequestRecord, faults: Sequence[FaultRecord], cuts_left: dict[int, int]) -> str:
    for fault in faults:
        kind = fault.spec.kind
        # The fault's span: from its order (`started`) until it settled (for the gateway,
        # until the restarted one is ready).
        overlaps = record.started <= fault.settled_at and record.ended >= fault.started
        if kind == "kill_gateway" and overlaps:
            return "gateway_restart"
        if not record.stream or record.error != "cut" or record.pod != fault.pod:
            continue
        killed_at = fault.notes.get("killed_at", fault.started)
        if kind == "kill_engine" and record.started <= killed_at <= record.ended + 1.0:
            return "in_flight_on_killed_engine"
        if kind == "restart_wipe_cache" and overlaps:
            return "in_flight_on_restarted_engine"
        armed_before = fault.started <= record.started
        if kind == "close_midstream" and armed_before and cuts_left[id(fault)] > 0:
            cuts_left[id(fault)] -= 1
            return "close_midstream"
    return "unexpected"


def client_summary(
    records: Sequence[RequestRecord], faults: Sequence[FaultRecord], skipped: int, t0: float
) -> dict[str, Any]:
    failed = [r for r in records if r.error is not None]
    causes = attribute_failures(failed, faults)
    return {
        "requests": len(records),
        "streamed": sum(r.stream for r in records),
        "failed": len(failed),
        "failed_by_cause": dict(sorted(Counter(causes).items())),
        "failed_by_error": dict(sorted(Counter(str(r.error) for r in failed).items())),
        "failed_unexpected": causes.count("unexpected"),
        "failed_non_streamed_outside_gateway_restart": sum(
            1
            for r, c in zip(failed, causes, strict=True)
            if not r.stream and c != "gateway_restart"
        ),
        "skipped_over_inflight_cap": skipped,
        "failures": [
            {
                "t": round(r.started - t0, 3),
                "ended_t": round(r.ended - t0, 3),
                "stream": r.stream,
                "pod": r.pod,
                "status": r.status,
                "error": r.error,
                "cause": cause,
            }
            for r, cause in zip(failed, causes, strict=True)
        ],
    }


def fault_entry(
    record: FaultRecord,
    first: Convergence,
    healed: dict[str, str],
    after: Convergence | None,
    t0: float,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "index": record.spec.index,
        "kind": record.spec.kind,
        "pod": record.pod,
        "params": record.spec.params,
        "t": round(record.started - t0, 3),
        "settled_t": round(record.settled_at - t0, 3),
        "fired": record.fired,
        "converged": first.converged,
        "convergence_s": round(first.seconds, 3),
        "since_fault_s": round(first.seconds + record.settled_at - record.started, 3),
        "divergent_blocks": first.divergent,
        "missing_blocks": first.missing,
        "phantom_blocks": first.phantom,
        "not_whole": first.not_whole,
        "waits": first.waits,
        "divergent_examples": first.divergent_examples,
    }
    if healed:
        assert after is not None
        entry["healed"] = healed
        entry["after_heal"] = {
            "converged": after.converged,
            "convergence_s": round(after.seconds, 3),
            "divergent_blocks": after.divergent,
        }
    return entry


def fault_summary(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Overrun faults (and any other fault that left a pod degraded for good) are reported
    apart: their index is a subset of the engine's until healed, by design."""
    regular = [e for e in entries if not e.get("healed")]
    degraded = [e for e in entries if e.get("healed")]
    times = [e["convergence_s"] for e in regular if e["converged"]]
    after = [e["after_heal"] for e in degraded]
    return {
        "faults": len(entries),
        "faults_by_kind": dict(sorted(Counter(e["kind"] for e in entries).items())),
        "converged": sum(e["converged"] for e in regular),
        "not_converged": sum(not e["converged"] for e in regular),
        "divergent_blocks_after_convergence": sum(e["divergent_blocks"] for e in regular),
        "convergence_p50_s": round(percentile(times, 50), 3) if times else None,
        "convergence_max_s": round(max(times), 3) if times else None,
        "degraded": {
            "faults": len(degraded),
            "by_kind": dict(sorted(Counter(e["kind"] for e in degraded).items())),
            "phantom_blocks": sum(e["phantom_blocks"] for e in degraded),
            "missing_blocks": sum(e["missing_blocks"] for e in degraded),
            "healed_converged": sum(a["converged"] for a in after),
            "divergent_blocks_after_heal": sum(a["divergent_blocks"] for a in after),
        },
    }


def memory_summary(samples: Sequence[Sample]) -> dict[str, Any]:
    rss = [s.rss_bytes / 2**20 for s in samples]
    return {
        "samples": len(samples),
        "rss_mb_first": round(rss[0], 1) if rss else None,
        "rss_mb_last": round(rss[-1], 1) if rss else None,
        "rss_mb_max": round(max(rss), 1) if rss else None,
        "gateway_pids": len({s.pid for s in samples}),
        # One figure per gateway process (each kill_gateway starts a new one from scratch).
        "rss_mb_max_per_process": [
            round(max(s.rss_bytes for s in samples if s.pid == pid) / 2**20, 1)
            for pid in dict.fromkeys(s.pid for s in samples)
        ],
    }


def table_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    faults, clients, memory = results["faults"], results["clients"], results["memory"]
    p50, worst = faults["convergence_p50_s"], faults["convergence_max_s"]
    degraded = faults["degraded"]
    return [
        ("faults applied", str(faults["faults"]), ", ".join(faults["faults_by_kind"])),
        (
            "converged (whole + equal)",
            f"{faults['converged']}/{faults['faults'] - degraded['faults']}",
            "",
        ),
        (
            "divergent blocks after convergence",
            str(faults["divergent_blocks_after_convergence"]),
            "target 0",
        ),
        ("convergence p50", f"{p50} s", f"target <= {CONVERGENCE_TARGET_S} s"),
        ("convergence max", f"{worst} s", f"target <= {CONVERGENCE_TARGET_S} s"),
        (
            "degraded until healed (overrun...)",
            str(degraded["faults"]),
            f"phantom {degraded['phantom_blocks']}, missing {degraded['missing_blocks']}",
        ),
        ("client requests", str(clients["requests"]), f"{clients['streamed']} streamed"),
        ("client requests failed", str(clients["failed"]), str(clients["failed_by_cause"])),
        ("  unexpected failures", str(clients["failed_unexpected"]), "target 0"),
        (
            "gateway RSS first/last/max",
            f"{memory['rss_mb_first']}/{memory['rss_mb_last']}/{memory['rss_mb_max']} MB",
            "",
        ),
    ]


def plot_timeline(
    path: Path,
    entries: Sequence[dict[str, Any]],
    records: Sequence[RequestRecord],
    samples: Sequence[Sample],
    t0: float,
    title: str,
) -> None:
    with figure(path, 3, 1, figsize=(11, 8), sharex=True, dpi=110) as (
        fig,
        (ax_req, ax_conv, ax_mem),
    ):
        ok = [r.ended - t0 for r in records if r.error is None]
        bad = [r.ended - t0 for r in records if r.error is not None]
        if ok:
            bins = max(10, int(max(ok) - min(ok)) + 1)
            ax_req.hist(ok, bins=bins, color="tab:green", alpha=0.6, label="completed / s")
        if bad:
            ax_req.scatter(bad, [0.5] * len(bad), color="tab:red", marker="x", label="failed")
        ax_req.set_ylabel("client requests")
        ax_req.legend(loc="upper right", fontsize=8)
        import matplotlib  # installed: `figure` checked

        colors = matplotlib.colormaps["tab10"]
        kinds = sorted({e["kind"] for e in entries})
        for e in entries:
            color = colors(kinds.index(e["kind"]) % 10)
            for ax in (ax_req, ax_conv, ax_mem):
                ax.axvspan(e["t"], max(e["settled_t"], e["t"] + 0.05), color=color, alpha=0.25)
            height = e["convergence_s"]
            marker = "o" if e["converged"] and not e.get("healed") else "s"
            ax_conv.scatter([e["settled_t"]], [height], color=color, marker=marker)
        for kind in kinds:
            ax_conv.scatter([], [], color=colors(kinds.index(kind) % 10), label=kind)
        ax_conv.axhline(CONVERGENCE_TARGET_S, color="grey", linestyle="--", linewidth=0.8)
        ax_conv.set_ylabel("convergence (s)\nsquare: degraded/healed")
        ax_conv.legend(loc="upper right", fontsize=7, ncol=2)
        if samples:
            ax_mem.plot([s.t for s in samples], [s.rss_bytes / 2**20 for s in samples], "-o",
                        markersize=2, label="gateway RSS (MB)")  # fmt: skip
            ax_mem.legend(loc="lower right", fontsize=8)
        ax_mem.set_ylabel("RSS (MB)")
        ax_mem.set_xlabel("seconds since start")
        fig.suptitle(title)
