"""Replayed production traces (`kvgate bench routing --trace`): reading Mooncake's format,
slicing it, synthesizing prompts whose prefix structure is the trace's, sessions, the
fleet a trace is served by, and a tiny end-to-end replay.

The trace files here are written by the tests in Mooncake's format; the real traces are
replayed by the benchmark, not by the suite.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.harness.vllm_model import BENCH_SHAPE
from bench.routing.engines import EngineChoice, RealEngines
from bench.routing.fleet import (
    BLOCK_SIZE,
    TRACE_KV_TOKENS,
    plan_trace_fleet,
    trace_service_seconds,
)
from bench.routing.loadgen import LoadSpec
from bench.routing.report import check_targets
from bench.routing.script import schedule, trace_speed
from bench.routing.summary import RunResult
from bench.routing.trace import (
    TRACE_BLOCK_TOKENS,
    TraceError,
    TraceRequest,
    TraceSpec,
    TraceText,
    describe,
    load_trace,
    read_trace,
    reused_blocks,
    sessions,
    trace_script,
)
from bench.routing.workloads import WorkloadSize
from bench.workloads.chat import WORDS as VOCABULARY
from simulator.tokenizer import SimTokenizer

B = TRACE_BLOCK_TOKENS


def _row(at_ms: float, length: int, ids: list[int], output: int = 20) -> dict[str, Any]:
    return {"timestamp": at_ms, "input_length": length, "output_length": output,
            "hash_ids": ids}  # fmt: skip


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


CONVERSATION = [
    _row(0, 2 * B + 100, [0, 1, 2]),  # opens a session (shared system block 0, own 1, 2)
    _row(0, B + 7, [0, 3]),  # shares only the system block: a session of its own
    _row(1500, 3 * B, [0, 1, 4]),  # begins with the first's full blocks [0, 1]: its next turn
    _row(3000, 4 * B + 1, [0, 1, 4, 5, 6]),  # the third's whole prompt, then more
    _row(4500, 2 * B, [0, 7], output=900),
]


def test_a_trace_is_read_in_time_order_with_each_request_as_recorded(tmp_path: Path) -> None:
    rows = [CONVERSATION[2], CONVERSATION[0], CONVERSATION[1]]
    requests = read_trace(_write(tmp_path / "t.jsonl", rows))
    assert [r.at_s for r in requests] == [0.0, 0.0, 1.5]
    assert requests[0] == TraceRequest(0.0, 2 * B + 100, 20, (0, 1, 2))
    assert requests[1].hash_ids == (0, 3)  # one instant: the file's order kept


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps(_row(-1, B, [0])), "timestamp must be a number"),
        (json.dumps(_row(True, B, [0])), "timestamp must be a number"),
        (json.dumps({**_row(0, B, [0]), "input_length": 0}), "input_length must be an integer"),
        (json.dumps({**_row(0, B, [0]), "output_length": "9"}), "output_length must be"),
        (json.dumps({**_row(0, B, [0]), "hash_ids": [0, "1"]}), "hash_ids must be a list"),
        (json.dumps(_row(0, B + 1, [0])), "1 hash_ids for 513 input tokens"),
    ],
)
def test_a_malformed_line_is_refused_with_where_and_why(
    tmp_path: Path, row: str, says: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row(0, B, [0])) + "\n\n" + row + "\n")
    with pytest.raises(TraceError, match=f"bad.jsonl:3: {says}"):
        read_trace(path)


def test_a_window_selects_rebases_and_caps_the_answers(tmp_path: Path) -> None:
    path = _write(tmp_path / "conversation_trace.jsonl", CONVERSATION)
    spec = TraceSpec(str(path), window=(1.0, 4.0), max_output=10)
    assert spec.name == "trace:conversation_trace"
    requests = load_trace(spec)
    assert [(r.at_s, r.output_length) for r in requests] == [(0.5, 10), (2.0, 10)]
    assert TraceSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    with pytest.raises(TraceError, match="no request in the window 10:20 s"):
        load_trace(TraceSpec(str(path), window=(10.0, 20.0)))


def test_prompts_reproduce_the_traces_prefix_structure_token_for_token(tmp_path: Path) -> None:
    """Equal hash ids are identical 512-token blocks, different ids different ones, the
    last block cut to input_length: two prompts share exactly their common ids' tokens."""
    tokenizer = SimTokenizer.load()
    header = tokenizer.encode("<s><|user|>\n", add_special_tokens=False)
    path = _write(tmp_path / "t.jsonl", CONVERSATION)
    script = trace_script(TraceSpec(str(path)), seed=7, vocabulary=VOCABULARY)
    prompts = []
    for conversation in script.conversations:
        (turn,) = conversation.turns
        content = tokenizer.encode(turn.request_messages()[0]["content"], add_special_tokens=False)
        assert len(content) == turn.prompt_tokens()  # every word one token
        prompts.append(content)
        rendered = tokenizer.encode_chat({"messages": turn.request_messages()}, completions=True)
        assert rendered[: len(header) + len(content)] == header + content  # only wrapped

    def shared(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                    min(len(a), len(b)))  # fmt: skip

    lengths = [r["input_length"] for r in CONVERSATION]
    assert [len(p) for p in prompts] == lengths
    assert shared(prompts[0], prompts[1]) == B  # block 0 only
    assert shared(prompts[0], prompts[2]) == 2 * B  # blocks 0, 1
    assert shared(prompts[2], prompts[3]) == 3 * B  # the third's whole prompt
    assert shared(prompts[1], prompts[4]) == B
    again = trace_script(TraceSpec(str(path)), seed=7, vocabulary=VOCABULARY)
    assert again.conversations[3].turns[0].request_messages() == (
        script.conversations[3].turns[0].request_messages()
    )  # any process rebuilds the same text
    other = TraceText(VOCABULARY, seed=8)
    assert other.block(0) != TraceText(VOCABULARY, seed=7).block(0)


def test_a_request_continues_the_session_whose_whole_prompt_it_begins_with() -> None:
    requests = [TraceRequest(i, row["input_length"], 1, tuple(row["hash_ids"]))
                for i, row in enumerate(CONVERSATION)]  # fmt: skip
    assert sessions(requests) == [0, 1, 0, 0, 2]


def test_the_script_is_one_timed_request_per_conversation_tagged_by_size(tmp_path: Path) -> None:
    rows = [_row(0, 2000, [0, 1, 2, 3]), _row(1000, 8 * B, list(range(4, 12))),
            _row(2000, 64 * B, list(range(12, 76)))]  # fmt: skip
    script = trace_script(TraceSpec(str(_write(tmp_path / "t.jsonl", rows))), 0, VOCABULARY)
    assert [c.tag for c in script.conversations] == ["short", "mid", "long"]
    assert script.arrivals == (0.0, 1.0, 2.0) and script.natural_rate == 1.5
    assert script.working_set_tokens() == 76 * B  # the distinct blocks
    at_twice = schedule(script, rate=3.0, seed=0)  # twice the recorded pace
    assert trace_speed(script, 3.0) == 2.0
    assert at_twice == [(0.0, 0, 0), (0.5, 1, 0), (1.0, 2, 0)]


def test_reuse_counts_leading_blocks_an_earlier_request_computed_within_a_cache() -> None:
    requests = [
        TraceRequest(0, 3 * B, 1, (0, 1, 2)),
        TraceRequest(0, 3 * B, 1, (5, 6, 7)),
        TraceRequest(0, 3 * B, 1, (0, 1, 9)),
        TraceRequest(0, 2 * B, 1, (0, 8)),
    ]
    assert reused_blocks(requests) == [0, 0, 2, 1]
    # a cache of 4 blocks has lost 0 and 1 by the third request, which computes them again
    assert reused_blocks(requests, capacity_blocks=4) == [0, 0, 0, 1]
    figures = describe(requests)
    assert figures["requests"] == 4 and figures["reused_block_share"] == 3 / 11


def test_a_traces_fleet_is_sized_as_real_engines_and_admits_its_longest_request() -> None:
    requests = [TraceRequest(0, 100 * B, 300, tuple(range(100))),
                TraceRequest(1, 100 * B, 300, tuple(range(100)))]  # fmt: skip
    plan = plan_trace_fleet(requests, 8, 1.0)
    assert plan.gpu_blocks * BLOCK_SIZE == TRACE_KV_TOKENS
    assert plan.max_model_len > 100 * B + 300
    # the second finds every block cached but the last token's (always computed): whole
    # engine blocks up to it
    cached = (100 * B - 1) // BLOCK_SIZE * BLOCK_SIZE
    cold = plan.latency.prefill_seconds(100 * B)
    warm = plan.latency.prefill_seconds(100 * B - cached, cached)
    decode = 300 * (plan.latency.decode_ms_per_token / 32 + plan.latency.decode_ms_per_seq) / 1e3
    assert trace_service_seconds(requests, plan) == pytest.approx((cold + warm) / 2 + decode)


def test_the_load_generator_rebuilds_the_same_trace_from_its_spec(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", CONVERSATION)
    trace = TraceSpec(str(path), (0.0, 10.0), 50)
    spec = LoadSpec("http://127.0.0.1:1", "sim-model", trace.name, WorkloadSize(), 3, "open",
                    1.0, 0, 1.0, trace=trace, vocabulary=("the", "of"))  # fmt: skip
    again = LoadSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec
    script = again.script()
    assert script.name == "trace:t" and script.requests == len(CONVERSATION)
    words = set(script.conversations[0].turns[0].request_messages()[0]["content"].split())
    assert words == {"the", "of"}


def test_a_tiny_trace_replay_prints_the_table_and_writes_results(tmp_path: Path) -> None:
    rows = [_row(i * 400, 3 * B + 1 + (i % 5) * 100, [0, 1 + i % 4, 10 + i, 100 + i], output=8)
            for i in range(24)]  # fmt: skip
    path = _write(tmp_path / "tiny_trace.jsonl", rows)
    out_dir = tmp_path / "out"
    command = [
        sys.executable, "-m", "gateway.cli", "bench", "routing", "--engines", "2",
        "--trace", str(path), "--trace-max-output", "4", "--routers",
        "prefix-cache,round-robin,sticky-rr", "--time-scale", "4", "--out", str(out_dir),
        "--quiet",
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "workload trace:tiny_trace" in out.stdout
    assert "× its recorded pace" in out.stdout
    document = json.loads((out_dir / "routing.json").read_text())
    fleet = document["fleets"]["trace:tiny_trace"]
    assert fleet["trace"]["requests"] == 24
    runs = {run["router"]: run for run in document["runs"]}
    assert set(runs) == {"prefix-cache", "round-robin", "sticky-rr"}
    for run in runs.values():
        assert run["workload"] == "trace:tiny_trace"
        assert run["requests"] == 24 and run["errors"] == 0
        assert run["trace_speed"] == pytest.approx(
            run["rate_rps"] / fleet["trace"]["natural_rate_rps"]
        )
        assert sum(run["engine_prompt_share"].values()) == pytest.approx(1.0)
        assert run["hit_rate"] > 0  # the shared first block, at least
    assert runs["prefix-cache"]["prediction"]["n"] == 24


def test_bad_trace_arguments_are_refused_before_anything_starts(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", CONVERSATION)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "gateway.cli", "bench", "routing", *args,
                   "--out", str(tmp_path / "out")]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    missing = run("--trace", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and "--trace:" in missing.stdout
    closed = run("--trace", str(path), "--closed", "4")
    assert closed.returncode == 2 and "--closed does not apply" in closed.stdout
    window = run("--trace", str(path), "--trace-window", "5:1")
    assert window.returncode == 2 and "START < END" in window.stderr
    speed = run("--trace", str(path), "--trace-speed", "0")
    assert speed.returncode == 2 and "--trace-speed" in speed.stdout
    (tmp_path / "other").mkdir()
    twin = _write(tmp_path / "other" / "t.jsonl", CONVERSATION)
    same = run("--trace", str(path), "--trace", str(twin))
    assert same.returncode == 2 and "two traces of one name" in same.stdout
    assert not (tmp_path / "out").exists()


def test_a_traces_targets_are_the_tail_the_cache_and_the_balance() -> None:
    def run(router: str, p90: float, p99: float, hit: float, shares: list[float]) -> RunResult:
        latency = {"p50": p90 / 2, "p90": p90, "p99": p99, "mean": p90 / 2}
        prompts = {f"e{i}": share for i, share in enumerate(shares)}
        return RunResult("trace:synthetic_trace", router, 0.8, 2.0, 700, 0, latency, latency,
                         latency, 1.0, 90.0, hit, hit, {}, 1.0,
                         engine_prompt_share=prompts)  # fmt: skip

    results = [
        run("prefix-cache", 1000.0, 5000.0, 0.30, [0.3, 0.3, 0.3, 0.1]),
        run("round-robin", 1600.0, 4800.0, 0.10, [0.25] * 4),
        run("oracle", 9000.0, 20000.0, 0.32, [0.7, 0.1, 0.1, 0.1]),
    ]
    lines = check_targets(results)
    assert "  ✓ TTFT p99 within 10 % of the lowest: 5,000 vs round-robin 4,800 ms" in lines
    assert "  ✓ hit rate ≥ 90 % of the oracle's: 30.0% vs 32.0% (94%)" in lines
    assert "  ✗ no engine under half its share of the prompt tokens: least e3 10.0% of 25.0%" in (
        lines
    )
    assert "  ✓ TTFT p90 ≥ 1.5× lower than round-robin's: 1.6×" in lines
    results[0] = run("prefix-cache", 1100.0, 5300.0, 0.28, [0.25] * 4)
    lines = check_targets(results)
    assert "  ✗ TTFT p99 within 10 % of the lowest: 5,300 vs round-robin 4,800 ms" in lines
    assert "  ✗ hit rate ≥ 90 % of the oracle's: 28.0% vs 32.0% (88%)" in lines
    assert "  ✓ no engine under half its share of the prompt tokens: least e0 25.0% of 25.0%" in (
        lines
    )
    assert "  ✗ TTFT p90 ≥ 1.5× lower than round-robin's: 1.5×" in lines


def test_a_scaled_trace_keeps_its_structure_in_shorter_blocks(tmp_path: Path) -> None:
    """Engines that serve a fraction of the trace's lengths (real ones on CPU) get every
    length times the scale: blocks of 512 × scale tokens, each prompt's last block and its
    answer alike, the hash ids as they are."""
    path = _write(tmp_path / "t.jsonl", CONVERSATION)
    spec = TraceSpec(str(path), scale=1 / 16)
    assert spec.block_tokens == 32
    requests = load_trace(spec)
    # 2 × 512 + 100 → 2 × 32 + round(100 / 16); 4 × 512 + 1 → 4 × 32 + 1 (at least a token)
    assert [r.input_length for r in requests] == [70, 33, 96, 129, 64]
    assert [r.output_length for r in requests] == [1, 1, 1, 1, 56]
    assert all(r.block_tokens == 32 for r in requests)
    tokenizer = SimTokenizer.load()
    script = trace_script(spec, seed=0, vocabulary=VOCABULARY)
    prompts = [tokenizer.encode(c.turns[0].request_messages()[0]["content"],
                                add_special_tokens=False)
               for c in script.conversations]  # fmt: skip
    assert [len(p) for p in prompts] == [70, 33, 96, 129, 64]
    assert prompts[2][:64] == prompts[0][:64] and prompts[2][64] != prompts[0][64]
    assert prompts[3][:96] == prompts[2]  # the third's whole prompt, then more
    assert TraceSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_engines_are_a_count_of_simulated_vllm_or_sglang_ones_or_of_real_vllm_ones() -> None:
    assert EngineChoice.parse("8") == EngineChoice(8, "sim")
    assert EngineChoice.parse("8").flavor == "vllm"
    real = EngineChoice.parse("vllm:2")
    assert real == EngineChoice(2, "vllm") and real.real
    sglang = EngineChoice.parse("sglang:4")
    assert sglang == EngineChoice(4, "sglang") and not sglang.real and sglang.flavor == "sglang"
    for bad in ("0", "vllm:0", "sglang:0", "trtllm:2", "two", "vllm:"):
        with pytest.raises(argparse.ArgumentTypeError):
            EngineChoice.parse(bad)


def test_real_engines_admit_the_longest_request_in_whole_vllm_blocks() -> None:
    plan = plan_trace_fleet([TraceRequest(0, 1000, 50, (0, 1))], 2, 1.0, kv_tokens=20_000)
    fitted = RealEngines.context(plan, 1050)
    assert fitted.max_model_len % 32 == 0 and fitted.max_model_len >= 1050
    assert RealEngines.context(plan, 10**6).max_model_len == BENCH_SHAPE.max_model_len
