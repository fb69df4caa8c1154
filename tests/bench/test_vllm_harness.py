"""The parts of the real-vLLM harness that need no vLLM: the latency fit, the engine's
flags and environment, where its sockets go, and pinning a child to a core.
(`tests/e2e_vllm/test_vllm_fleet.py` runs the fleet itself where vLLM is installed.)"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import pytest

from bench.harness.processes import ChildProcess
from bench.harness.vllm_fleet import VllmOptions, VllmProcess, environment, socket_dir
from bench.harness.vllm_latency import LatencyProfile, fit_decode, fit_prefill
from bench.harness.vllm_model import (
    BENCH_SHAPE,
    SIMULATOR_TOKENIZER,
    LlamaShape,
    ModelBuildError,
    VllmNotInstalled,
    build_bench_model,
    main,
    vllm_python,
)
from bench.workloads.chat import WORDS
from simulator.tokenizer import SimTokenizer
from tokenization import ModelTokenizer


def test_fit_prefill_recovers_a_quadratic() -> None:
    points = {p: 0.03 + 400e-6 * p + 0.4e-9 * p * p for p in (128, 256, 512, 1024, 2048)}
    overhead, linear, square = fit_prefill(points)
    assert overhead == pytest.approx(0.03, rel=1e-6)
    assert linear == pytest.approx(400e-6, rel=1e-6)
    assert square == pytest.approx(0.4e-9, rel=1e-6)


def test_fit_prefill_never_goes_negative() -> None:
    concave = {128: 0.2, 256: 0.3, 512: 0.5, 1024: 0.8, 2048: 1.3}  # q < 0 fits best
    assert min(fit_prefill(concave)) >= 0
    linear = {256: 0.256, 512: 0.512, 1024: 1.024}
    overhead, per_token, square = fit_prefill(linear)
    assert per_token == pytest.approx(1e-3, rel=1e-6)
    assert overhead == pytest.approx(0, abs=1e-9) and square == pytest.approx(0, abs=1e-12)


def test_fit_decode_through_both_batches() -> None:
    assert fit_decode({1: 20.0, 4: 32.0}) == pytest.approx((16.0, 4.0))
    assert fit_decode({1: 20.0, 4: 19.0}) == (20.0, 0.0)  # a noisy larger batch
    assert fit_decode({1: 20.0}) == (20.0, 0.0)


def test_profile_to_latency_model_units() -> None:
    points = {p: 0.03 + 400e-6 * p for p in (256, 512, 1024)}
    model = LatencyProfile(points, {1: 20.0, 4: 32.0}).model()
    assert model.request_overhead_ms == pytest.approx(30.0)
    assert model.prefill_us_per_token == pytest.approx(400.0)
    assert model.prefill_seconds(1000) == pytest.approx(0.43)
    assert model.decode_step_seconds(1) == pytest.approx(0.020)


def test_engine_flags() -> None:
    options = VllmOptions(Path("/m"), num_blocks=300, max_model_len=4096, topic="t")
    args = options.args(8000, "ipc:///r/e0-events.sock", "ipc:///r/e0-replay.sock")
    flags = dict(itertools.pairwise(args))
    assert args[:2] == ["serve", "/m"]
    assert flags["--num-gpu-blocks-override"] == "300"
    assert flags["--max-model-len"] == "4096"
    assert flags["--block-size"] == "32"
    assert flags["--load-format"] == "dummy"
    assert flags["--dtype"] == "float32"
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(args)
    events = json.loads(flags["--kv-events-config"])
    assert events == {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": "ipc:///r/e0-events.sock",
                      "replay_endpoint": "ipc:///r/e0-replay.sock", "topic": "t"}  # fmt: skip


def test_engine_environment_binds_one_thread_to_the_core() -> None:
    env = environment(1)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONHASHSEED"] == "0"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"


def test_sockets_go_to_a_short_directory_when_the_run_directory_is_too_long(
    tmp_path: Path,
) -> None:
    assert socket_dir(tmp_path, "e0-replay.sock") == (tmp_path.resolve(), False)
    deep = tmp_path / ("d" * 120)
    where, private = socket_dir(deep, "e0-replay.sock")
    try:
        assert private and len(str(where)) < 60 and deep.is_dir()
    finally:
        where.rmdir()


def test_shape_rejects_a_head_size_cpu_attention_lacks() -> None:
    with pytest.raises(ValueError, match="head size 16"):
        LlamaShape(256, 512, 2, 16, 3000, 2048)
    assert BENCH_SHAPE.head_dim == 64
    assert BENCH_SHAPE.kv_bytes_per_token == 2 * 8 * 8 * 64 * 4


def test_the_bench_model_has_the_simulators_tokenizer(tmp_path: Path) -> None:
    """Real and simulated engines of the routing benchmark tokenize and render alike."""
    model = build_bench_model(tmp_path / "model")
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (model / name).read_bytes() == (SIMULATOR_TOKENIZER / name).read_bytes()
    tokenizer = ModelTokenizer.load(model)
    config = json.loads((model / "config.json").read_text())
    assert config["vocab_size"] == tokenizer.vocab_size == BENCH_SHAPE.vocab_size
    assert config["bos_token_id"] == tokenizer.token_id("<s>")
    assert config["eos_token_id"] == tokenizer.token_id("</s>")
    assert tokenizer.max_model_len == BENCH_SHAPE.max_model_len
    request = {"messages": [{"role": "system", "content": "be brief"},
                            {"role": "user", "content": " ".join(WORDS[:50])}]}  # fmt: skip
    assert tokenizer.encode_chat(request) == SimTokenizer.load().encode_chat(
        request, completions=True
    )
    with pytest.raises(ModelBuildError, match="8192 tokens"):
        build_bench_model(tmp_path / "small", LlamaShape(512, 1536, 8, 8, 4096, 8192))


def test_the_simulators_tokenizer_is_regenerated_by_the_trainer(tmp_path: Path) -> None:
    """`python -m bench.harness.vllm_model --simulator-tokenizer DIR` writes the shipped
    files (the vocabulary depends on the Python whose standard library it reads)."""
    main(["--simulator-tokenizer", str(tmp_path)])
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / name).read_bytes() == (SIMULATOR_TOKENIZER / name).read_bytes()
    tokenizer = SimTokenizer.load(tmp_path)
    assert tokenizer.vocab_size == BENCH_SHAPE.vocab_size
    assert all(len(tokenizer.encode(f" {w}", add_special_tokens=False)) == 1 for w in WORDS)
    with pytest.raises(SystemExit):
        main([])


def test_missing_vllm_venv_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(VllmNotInstalled, match=r"scripts/e2e-vllm\.sh"):
        vllm_python(tmp_path)


@pytest.mark.skipif(sys.platform != "linux", reason="CPU affinity is Linux's")
async def test_child_pinned_to_one_cpu(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    child = ChildProcess("pinned", tmp_path / "pinned.log")
    command = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    await child.spawn(command, pipe=True, cpus={cpu})
    try:
        assert (await child.readline()).strip() == f"[{cpu}]"
    finally:
        await child.stop()


def test_options_refuse_a_cache_vllm_would_refuse() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        VllmOptions(Path("/m"), num_blocks=300, max_model_len=4096, block_size=16)
    with pytest.raises(ValueError, match="at least 129"):
        VllmOptions(Path("/m"), num_blocks=128, max_model_len=4096)
    VllmOptions(Path("/m"), num_blocks=129, max_model_len=4096)


def test_a_failed_start_quotes_the_root_cause(tmp_path: Path) -> None:
    options = VllmOptions(Path("/m"), num_blocks=300, max_model_len=4096)
    engine = VllmProcess(options, tmp_path, name="e0", cpu=0, python=Path(sys.executable))
    log = "\n".join([
        "(EngineCore pid=1) ERROR [core.py:1510] ValueError: To serve at least one request",
        *(f"line {i}" for i in range(100)),
        "ValueError: To serve at least one request",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ])  # fmt: skip
    message = engine._failure(600, log)
    assert "ValueError: To serve at least one request'" in message
    assert "RuntimeError: Engine core initialization failed" in message
    assert "line 99" in message and "line 10\n" not in message
