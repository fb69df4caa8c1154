"""`kvgate bench overhead`, run as users run it (a real subprocess, tiny sizes).

Behaviour only: every figure is written and positive, nothing failed, every process the
benchmark started is gone. Timings are never asserted.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

from bench.overhead.fleet import stream_fleet
from bench.overhead.streams import StreamPlan, stream_phase
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
    "added_p50_ms_c1_tokenized_local",
    "added_p50_ms_c1_chat_distinct",
    "added_p50_ms_c1_chat_distinct_local",
    "added_p99_ms_c32_chat_distinct_local",
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
        "--streams", "2", "--stream-tokens", "8", "--stream-rounds", "1",
        "--stream-decode-ms", "5", "--json", str(out), "--plot", str(plot),
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
    assert set(pids) == {"engine-0", "gateway", "gateway-local", "relay"}
    assert not [name for name, pid in pids.items() if _running(pid)]
    kvgate = figures["routers"]["kvgate"]
    assert kvgate["cpu_us_per_request_c1"] > 0
    tokenizers = figures["tokenizers"]
    assert set(tokenizers) == {
        f"c{c}_{kind}" for c in (1, 32) for kind in ("tokenized", "tokenized_distinct",
                                                      "chat_distinct")
    }  # fmt: skip
    for key, sides in tokenizers.items():
        assert sides["local"]["gateway_cpu_us_per_request"] > 0, key
        assert sides["remote"]["gateway_cpu_us_per_request"] > 0, key
        assert key in result.stdout
    assert figures["cases"]["c1_chat_distinct_local"]["via"] == "gateway-local"
    for key in ("c1", "c1_tokenized_distinct", "c1_chat_distinct_local"):
        case = figures["cases"][key]
        assert case["gateway_cpu_us_per_request"] > 0, key  # its own run: 500 requests at least
        # 30 alternating requests are a few 10 ms CPU ticks: present, but may round to 0.
        assert case["gateway_cpu_us_per_request_interleaved"] >= 0, key
    assert kvgate["stream_chunks"] == 2 * 2 * 8  # 2 x --streams per round, 8 tokens each
    assert {row["ok"] for row in figures["targets"]} <= {True, False, None}
    assert "added inter-chunk delay p99" in result.stdout
    pick = figures["epp_pick"]  # kvgate epp's pick over gRPC beside the null picker's
    for mode in ("FULL_DUPLEX_STREAMED", "BUFFERED"):
        for level, requests in (("c1", 30), ("c32", 64)):
            figures_ = pick[mode][level]
            for side in ("picker", "null"):
                assert figures_[side]["requests"] == requests, (mode, level, side)
                assert 0 < figures_[side]["p50_ms"] <= figures_[side]["p90_ms"]
            assert len(figures_["added_p50_ms_by_slice"]) == 4
    assert isinstance(pick["met"], bool)
    assert "kvgate epp pick" in result.stdout


async def test_streaming_phase_counts_every_chunk_the_engine_sent(tmp_path: Path) -> None:
    """The quick streaming phase against real processes (an engine at a 5 ms decode step,
    `kvgate serve`): every figure present, every chunk counted, the processes gone."""
    plan = StreamPlan(streams=4, tokens=16, rounds=2, decode_ms=(5.0, 0.2))
    async with stream_fleet(tmp_path, plan.decode_ms) as fleet:
        figures, samples = await asyncio.wait_for(stream_phase(plan, fleet), timeout=60)
        pids = [child.pid for child in fleet.children]
    sent = plan.rounds * plan.per_round * plan.tokens
    assert set(figures["targets"]) == {"direct", "kvgate"}
    for name, target in figures["targets"].items():
        assert target["failed_streams"] == {}, name
        assert target["streams"] == plan.rounds * plan.per_round, name
        assert target["chunks"] == target["engine_chunks"] == sent, name
        assert 0 < target["ttft_p50_ms"] <= target["ttft_p99_ms"], name
        assert 0 <= target["itl_p50_ms"] <= target["itl_p99_ms"], name
        assert 0 < target["engine_ttft_mean_ms"] < target["ttft_mean_ms"], name
    kvgate = figures["routers"]["kvgate"]
    assert set(kvgate) >= {
        "stream_cpu_ms_per_1k_chunks", "stream_added_ttft_p50_ms", "stream_added_itl_p99_ms"
    }  # fmt: skip
    assert kvgate["stream_chunks"] == sent
    assert kvgate["stream_cpu_ms_per_1k_chunks"] >= 0
    assert all(math.isfinite(value) for value in kvgate.values())
    assert not [pid for pid in pids if pid is not None and _running(pid)]
    ttft_ms, gaps_ms = samples["kvgate"]
    assert len(ttft_ms) == plan.rounds * plan.per_round
    assert len(gaps_ms) == plan.rounds * plan.per_round * (plan.tokens - 1)
