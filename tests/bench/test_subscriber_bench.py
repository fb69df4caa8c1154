"""`kvgate bench subscriber`, run as users run it (a real subprocess, small sizes).

Behaviour only: the figures are written, the index equals what every engine holds, the
gaps were repaired by replay. Timings are never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_kvgate

FIGURES = (
    "engines",
    "ingest_events_per_s",
    "ingest_batches_per_s",
    "ingest_blocks_per_s",
    "subscriber_cpu_s",
    "index_equals_engines",
    "gap_recovery_p50_ms",
    "gap_recovery_max_ms",
    "overrun_recovery_ms",
)


def test_bench_subscriber_ingests_and_recovers(tmp_path: Path) -> None:
    out = tmp_path / "subscriber.json"
    plot = tmp_path / "subscriber.png"
    args = [
        "bench", "subscriber", "--quick", "--engines", "2", "--seconds", "1", "--batches", "300",
        "--gap-rounds", "2", "--gpu-blocks", "1024", "--json", str(out), "--plot", str(plot),
    ]  # fmt: skip
    result = run_kvgate(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    for key in FIGURES:
        assert key in figures, key
    assert figures["engines"] == 2
    assert figures["index_equals_engines"] is True
    assert all(check["equal"] for check in figures["index_checks"].values())
    assert figures["gap_rounds_consistent"] is True
    assert len(figures["gap_recovery_ms"]) == 2
    for phase in ("ingest", "live"):
        applied = figures[f"{phase}_applied"]
        assert applied == figures[f"{phase}_published"], phase
        assert applied["batches"] > 0 and applied["events"] > 0 and applied["blocks"] > 0
    assert figures["ingest_applied"]["batches"] == 2 * 300
    for key in ("ingest_events_per_s", "ingest_batches_per_s", "ingest_blocks_per_s"):
        assert figures[key] > 0, key
    assert figures["subscriber_cpu_s"] > 0
    # a gap longer than the replay buffer: the pod is reset, nothing stale is left behind
    assert figures["overrun_stale_blocks"] == 0
    assert figures["overrun_whole"] is False
    assert "overrun" in figures["overrun_degraded_reason"]
    assert "index_equals_engines" in result.stdout
    assert plot.stat().st_size > 0
