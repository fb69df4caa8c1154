"""`kvgate bench overhead`, run as users run it (a real subprocess, tiny sizes).

Behaviour only: every figure is written and positive, nothing failed, every process the
benchmark started is gone. Timings are never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_kvgate

FIGURES = (
    "added_p50_ms_c1",
    "added_p99_ms_c1",
    "added_p50_ms_c32",
    "added_p99_ms_c32",
    "added_p50_ms_c1_tokenized",
    "added_p99_ms_c1_tokenized",
    "added_p50_ms_c1_tokenized_distinct",
    "added_p50_ms_c32_tokenized",
    "stream_first_chunk_added_p50_ms",
    "stream_first_chunk_added_p99_ms",
    "max_rps_gateway",
    "max_rps_direct",
)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_bench_overhead_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    plot = tmp_path / "overhead.png"
    args = [
        "bench", "overhead", "--quick", "--requests", "30", "--requests-c32", "64",
        "--stream-requests", "30", "--duration", "1", "--rps-concurrency", "16",
        "--json", str(out), "--plot", str(plot),
    ]  # fmt: skip
    result = run_kvgate(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    for key in FIGURES:
        assert key in figures, key
        assert key in result.stdout, key
    for key in FIGURES:
        assert isinstance(figures[key], float), key  # an added latency may be < 0 (noise)
    for key, case in figures["cases"].items():
        assert case["errors"] == 0, key
        assert case["requests"] > 0, key
        for side in ("direct", "gateway"):
            assert case[f"{side}_p50_ms"] > 0, key
            assert case[f"{side}_p99_ms"] >= case[f"{side}_p50_ms"], key
    assert figures["max_rps_gateway"] > 0
    assert figures["max_rps_direct"] > 0
    assert figures["throughput"]["gateway_errors"] == 0
    assert figures["config"]["requests_c1"] == 30
    assert plot.stat().st_size > 0
    pids = figures["config"]["pids"]
    assert set(pids) == {"engine-0", "gateway", "relay"}
    assert not [name for name, pid in pids.items() if _running(pid)]
