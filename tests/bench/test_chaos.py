"""`kvgate bench chaos`, a short run (10 faults: every kind once) as users run it.

After every fault the index must equal every engine's cache (0 divergent blocks); a pod
left degraded by a replay buffer overrun holds no block the engine lacks and is whole
again once healed; the only client failures are those the faults explain.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.chaos.faults import KINDS, FaultRecord, FaultSpec
from bench.chaos.report import attribute_failures
from bench.harness.streaming import RequestRecord
from tests.helpers import run_kvgate


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_chaos_run_converges_after_every_fault(tmp_path: Path) -> None:
    out, plot, work = tmp_path / "chaos.json", tmp_path / "chaos.png", tmp_path / "work"
    result = run_kvgate(
        "bench",
        "chaos",
        "--faults",
        "10",
        "--engines",
        "3",
        "--rate",
        "15",
        "--timeout",
        "30",
        "--gap",
        "0.2",
        "--warmup",
        "2",
        "--seed",
        "7",
        "--json",
        str(out),
        "--plot",
        str(plot),
        "--workdir",
        str(work),
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    faults, clients = figures["faults"], figures["clients"]
    assert figures["baseline_converged"]
    assert faults["faults"] == 10
    assert set(faults["faults_by_kind"]) == set(KINDS)
    log = figures["fault_log"]
    assert all(entry["fired"] for entry in log), log
    # Every fault but an overrun converges by itself, to an index equal to the engines'.
    assert faults["not_converged"] == 0, log
    assert faults["divergent_blocks_after_convergence"] == 0, log
    degraded = faults["degraded"]
    assert set(degraded["by_kind"]) <= {"overrun_replay", "kill_gateway"}, log
    assert degraded["phantom_blocks"] == 0, log
    assert degraded["healed_converged"] == degraded["faults"], log
    assert degraded["divergent_blocks_after_heal"] == 0, log
    # Clients: only failures a fault explains; a non-streamed request never fails because
    # of an engine (the gateway retries it).
    assert clients["requests"] > 0
    assert clients["failed_unexpected"] == 0, clients["failures"]
    assert clients["failed_non_streamed_outside_gateway_restart"] == 0, clients["failures"]
    assert figures["restarts"]["gateway"] == 1
    assert sum(figures["restarts"]["engines"].values()) == 1
    assert figures["memory"]["samples"] > 0
    assert figures["memory"]["gateway_pids"] == 2
    assert plot.stat().st_size > 0
    assert "divergent blocks after convergence" in result.stdout
    pids = {sample["pid"] for sample in figures["samples"]}
    assert not [pid for pid in pids if _running(pid)]


def test_a_stream_cut_by_a_restart_that_wipes_the_cache_is_explained_only_on_its_pod() -> None:
    """A restart with a wiped cache ends every running request, as a real one does: a stream
    that ran on that pod across it is explained; one on another pod, or a non-streamed one
    (the gateway retries those), is not."""
    restart = FaultRecord(FaultSpec(0, "restart_wipe_cache", 0, {}), "e0", 3.0, settled_at=3.1)

    def cut(pod: str, started: float, *, stream: bool = True) -> RequestRecord:
        return RequestRecord(started, started + 0.2, 200, "cut", pod=pod, stream=stream)

    failed = [cut("e0", 2.9), cut("e1", 2.9), cut("e0", 2.9, stream=False), cut("e0", 3.5)]
    assert attribute_failures(failed, [restart]) == [
        "in_flight_on_restarted_engine",
        "unexpected",
        "unexpected",
        "unexpected",
    ]
