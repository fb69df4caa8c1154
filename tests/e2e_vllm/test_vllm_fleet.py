"""The routing benchmark's real-vLLM fleet (`bench.harness.vllm_fleet`): two engines on CPU,
each pinned to its own core, serving the benchmark's model.

The fleet is started once for the module, as the benchmark starts it; the tests check
what the benchmark relies on: the pinning, prompts of an exact length written from
single-token words, KV events on each engine's PUB socket and answers on its replay
socket, and a latency profile the simulator's model can be fitted to.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

from bench.harness.fleet import EngineEndpoint
from bench.harness.vllm_fleet import VllmFleet, single_token_words, start_vllm_fleet
from bench.harness.vllm_latency import ProfileSettings, cold_prompt, profile_engine
from bench.harness.vllm_model import build_bench_model
from bench.workloads.chat import WORDS
from tests.e2e_vllm.recorder import RawEventRecorder
from tests.helpers import eventually

pytestmark = [pytest.mark.e2e_vllm, pytest.mark.asyncio(loop_scope="module")]

ENGINES = 2
NUM_BLOCKS = 256
MAX_MODEL_LEN = 4096
END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay socket's last frame but one after the batches asked for."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(
    vllm_installed: None, tmp_path_factory: pytest.TempPathFactory, e2e_report: dict[str, object]
) -> AsyncIterator[VllmFleet]:
    if len(os.sched_getaffinity(0)) < ENGINES:
        pytest.skip(f"needs {ENGINES} cores to pin {ENGINES} engines apart")
    run_dir = tmp_path_factory.mktemp("fleet")
    python = Path(sys.executable)  # the vLLM venv's, as for the other e2e tests
    model_dir = build_bench_model(run_dir / "model")
    started = await start_vllm_fleet(ENGINES, run_dir, num_blocks=NUM_BLOCKS,
                                     max_model_len=MAX_MODEL_LEN, model_dir=model_dir,
                                     python=python)  # fmt: skip
    async with started:
        e2e_report["fleet start (s)"] = [round(s, 1) for s in started.start_s]
        e2e_report["fleet rss per engine (MiB)"] = [e.rss_total() >> 20 for e in started.engines]
        yield started


@pytest_asyncio.fixture(loop_scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=300.0) as http:
        yield http


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def words(fleet: VllmFleet) -> list[str]:
    async with httpx.AsyncClient(timeout=60.0) as http:
        return await single_token_words(http, fleet.endpoints[0], WORDS)


def _allowed_cpus(pid: int) -> set[str]:
    """Cpus_allowed_list of every thread of `pid`."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.add(line.split(":", 1)[1].strip())
    return found


async def test_each_engine_is_pinned_to_its_own_core(fleet: VllmFleet) -> None:
    cores = [engine.cpu for engine in fleet.engines]
    assert len(set(cores)) == ENGINES, cores
    for engine in fleet.engines:
        processes = engine.processes()
        assert len(processes) >= 3, processes  # API server, engine core, worker
        for pid in processes:
            assert _allowed_cpus(pid) == {str(engine.cpu)}, (engine.name, pid)


async def test_a_prompt_of_single_token_words_has_an_exact_length(
    fleet: VllmFleet, words: list[str], client: httpx.AsyncClient
) -> None:
    assert words == list(WORDS)  # the benchmark's model holds every one as a token
    prompt = cold_prompt(words, 301, random.Random(1))  # 300 words
    for endpoint in fleet.endpoints:
        body = {"model": endpoint.model, "prompt": prompt, "add_special_tokens": False}
        answer = await client.post(f"{endpoint.url}/tokenize", json=body)
        answer.raise_for_status()
        assert answer.json()["count"] == 300


async def test_kv_events_and_replay_on_every_engine(
    fleet: VllmFleet, words: list[str], client: httpx.AsyncClient
) -> None:
    for index, endpoint in enumerate(fleet.endpoints):
        prompt = cold_prompt(words, 200, random.Random(100 + index))
        await _stored_blocks_published(client, endpoint, fleet.topic, prompt, blocks=200 // 32)
        assert await _replayed(endpoint) >= 1


async def _stored_blocks_published(
    client: httpx.AsyncClient, endpoint: EngineEndpoint, topic: str, prompt: str, *, blocks: int
) -> None:
    """A raw SUB on the engine's PUB socket sees the prompt's `blocks` full blocks stored."""
    recorder = RawEventRecorder(endpoint.events, topic)
    await asyncio.to_thread(recorder.start)
    try:
        body = {"model": endpoint.model, "prompt": prompt, "max_tokens": 2}
        (await client.post(f"{endpoint.url}/v1/completions", json=body)).raise_for_status()
        await eventually(lambda: recorder.snapshot().stored_blocks >= blocks, within=30,
                         what=f"{endpoint.name}'s BlockStored events")  # fmt: skip
        assert recorder.snapshot().undecodable == 0
    finally:
        await asyncio.to_thread(recorder.close)


async def _replayed(endpoint: EngineEndpoint) -> int:
    """Batches the replay socket sends from seq 0 before its end marker."""
    context = zmq.asyncio.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint.replay)
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        batches = 0
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), timeout=10)
            _empty, _topic, seq, _payload = frames
            if seq == END_SEQ:
                return batches
            batches += 1
    finally:
        dealer.close(linger=0)
        context.term()


async def test_latency_profile_is_plausible(
    fleet: VllmFleet, words: list[str], client: httpx.AsyncClient, e2e_report: dict[str, object]
) -> None:
    endpoint = fleet.endpoints[0]
    settings = ProfileSettings(lengths=(128, 512, 1024), repeats=2, decode_tokens=24)
    profile = await profile_engine(client, endpoint, words, settings)
    e2e_report["prefill s by prompt tokens"] = {n: round(s, 3) for n, s in
                                                profile.prefill_s.items()}  # fmt: skip
    e2e_report["decode ms per step by batch"] = {b: round(ms, 1) for b, ms in
                                                 profile.decode_step_ms.items()}  # fmt: skip
    assert sorted(profile.prefill_s) == [128, 512, 1024]  # the engine counted them so
    assert profile.prefill_s[1024] > profile.prefill_s[128] > 0
    model = profile.model()
    e2e_report["fitted latency model"] = model
    prefill_1000 = model.prefill_seconds(1000)
    assert 0.05 < prefill_1000 < 60
    step_s = model.decode_step_seconds(1)
    assert 0 < step_s < prefill_1000 / 5  # prefill dominates
    # The cache was reset afterwards: a measured prompt is cold again.
    rng = random.Random(settings.seed)
    cold_prompt(words, 32, rng)  # the warm-up's
    measured = cold_prompt(words, 128, rng)
    body = {"model": endpoint.model, "prompt": measured, "max_tokens": 1}
    usage = (await client.post(f"{endpoint.url}/v1/completions", json=body)).json()["usage"]
    assert usage["prompt_tokens"] == 128
    assert (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
