"""`kvgate bench soak`, a tiny bounded run: the harness works and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_kvgate

KEYS = (
    "capacity_rps",
    "offered_rps",
    "achieved_rps",
    "requests",
    "lost_requests",
    "rss_mb_first",
    "rss_mb_last",
    "rss_mb_max",
    "rss_slope_mb_per_min",
    "open_fds_last",
    "open_fds_slope_per_min",
    "asyncio_tasks_last",
    "asyncio_tasks_slope_per_min",
    "faults",
    "final_whole",
    "final_divergent_blocks",
    "samples",
)


def test_soak_reports_trends_and_loses_no_request(tmp_path: Path) -> None:
    out, plot = tmp_path / "soak.json", tmp_path / "soak.png"
    result = run_kvgate(
        "bench",
        "soak",
        "--minutes",
        "0.25",
        "--engines",
        "2",
        "--capacity-seconds",
        "2",
        "--fault-every",
        "4",
        "--sample-interval",
        "1",
        "--warmup-fraction",
        "0.3",
        "--json",
        str(out),
        "--plot",
        str(plot),
        "--workdir",
        str(tmp_path / "work"),
        timeout=150,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    for key in KEYS:
        assert key in figures, key
    assert figures["capacity_rps"] > 0
    assert figures["requests"] > 0
    assert figures["lost_requests"] == 0
    assert len(figures["faults"]) >= 2
    assert all(f["fired"] for f in figures["faults"]), figures["faults"]
    assert figures["final_whole"] and figures["final_divergent_blocks"] == 0
    assert figures["steady_samples"] >= 3
    # The asyncio task gauge is read from the gateway's own /metrics.
    assert all(s["asyncio_tasks"] and s["asyncio_tasks"] > 0 for s in figures["samples"])
    assert all(s["open_fds"] and s["open_fds"] > 0 for s in figures["samples"])
    assert plot.stat().st_size > 0
    assert "RSS slope after warm-up" in result.stdout
