"""`kvgate bench routing`: deterministic workload generators, fleet sizing, the oracle's
view of real engines, and a tiny end-to-end run (2 engines, a few dozen requests).

Behaviour only: timings and the size of any improvement are never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import zmq.asyncio

from bench.harness.fleet import EngineEndpoint
from bench.harness.ports import free_port_block
from bench.harness.streaming import RequestRecord
from bench.routing import loadgen
from bench.routing.fleet import capacity_rps, plan_fleet
from bench.routing.loadgen import LoadSpec
from bench.routing.oracle import Engine, Oracle
from bench.routing.report import check_targets
from bench.routing.routers import kv_aware_args, make_router, needs_vllm_like_engines
from bench.routing.runner import RoutingOptions, ramp_for
from bench.routing.summary import RunResult, median_of, spread_of
from bench.routing.workloads import WORKLOADS, WorkloadSize, build, slowdown
from simulator import LatencyModel
from simulator.tokenizer import SimTokenizer
from tests.conftest import StartEngine
from tests.helpers import eventually

SMALL = WorkloadSize(
    conversations=5, turns=3, system_words=64, user_words_median=20, answer_tokens_median=6
)


@pytest.mark.parametrize("name", WORKLOADS)
def test_generators_are_deterministic_per_seed(name: str) -> None:
    first, again, other = build(name, SMALL, 7), build(name, SMALL, 7), build(name, SMALL, 8)
    assert first == again
    assert first != other
    assert first.requests > 0 and first.working_set_tokens() > 0


def test_chat_turns_extend_the_previous_prompt_and_share_system_prompts() -> None:
    script = build("chat", SMALL, 1)
    for conversation in script.conversations:
        assert conversation.shared_prefix in script.shared_prefixes
        for earlier, later in zip(conversation.turns, conversation.turns[1:], strict=False):
            assert later.messages[: len(earlier.messages)] == earlier.messages
            assert later.messages[len(earlier.messages)]["role"] == "assistant"
    systems = {c.turns[0].messages[0]["content"] for c in script.conversations}
    assert 1 <= len(systems) <= 4 < len(script.conversations) + 1


def test_agent_loops_append_tool_output() -> None:
    script = build("agent", SMALL, 2)
    longest = max(script.conversations, key=lambda c: len(c.turns))
    assert len(longest.turns) > SMALL.turns  # many short steps
    last = longest.turns[-1].messages
    assert [m["role"] for m in last[2:4]] == ["assistant", "tool"]
    # as OpenAI's API has it (sglang-router refuses a tool message without its call's id)
    calls = [m["tool_calls"][0]["id"] for m in last if m["role"] == "assistant"]
    answered = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert calls == answered and len(set(calls)) == len(calls) > 1
    assert all(m["tool_calls"][0]["type"] == "function" for m in last if m["role"] == "assistant")


@pytest.mark.parametrize("name", WORKLOADS)
def test_prompt_estimates_are_the_simulators_counts_but_a_fixed_few(name: str) -> None:
    """Fleets are sized and real engines' context set from the estimates: each misses
    only the template's fixed tokens (`<s>`, the answer's header, a system prompt's
    punctuation), however long an agent's loop of tool calls grows."""
    tokenizer = SimTokenizer.load()
    turns = [turn for c in build(name, SMALL, 3).conversations for turn in c.turns]
    missed = [
        len(tokenizer.encode_chat({"messages": turn.request_messages()}, completions=True))
        - turn.prompt_tokens()
        for turn in turns
    ]
    assert min(missed) >= 0 and max(missed) <= 16, missed


def _result(router: str, p90_ms: float, errors: int = 0) -> RunResult:
    latency = {"p50": p90_ms / 2, "p90": p90_ms, "p99": 2 * p90_ms, "mean": p90_ms / 2}
    return RunResult("agent", router, 0.8, 10.0, 1000, errors, latency, latency, latency, 9.0,
                     90.0, 0.9, 0.9, {"e0": 1.0}, 1.0)  # fmt: skip


def test_a_router_that_failed_requests_is_not_the_latency_to_beat() -> None:
    """Its percentiles cover only the requests it answered: left out of the comparison,
    and named."""
    results = [_result("prefix-cache", 200.0), _result("sticky-rr", 220.0),
               _result("sglang-router", 130.0, errors=900)]  # fmt: skip
    lowest = next(line for line in check_targets(results) if "lowest TTFT p90" in line)
    assert lowest.startswith("  ✓") and "200 vs sticky-rr 220 ms" in lowest
    assert "not compared: sglang-router (900 of 1,000 failed)" in lowest
    results[2] = _result("sglang-router", 130.0, errors=10)  # 1 %: still compared
    lowest = next(line for line in check_targets(results) if "lowest TTFT p90" in line)
    assert lowest.startswith("  ✗") and "sglang-router 130 ms" in lowest


def test_repeated_runs_are_reported_by_their_medians_and_spread() -> None:
    runs = [
        dataclasses.replace(_result("prefix-cache", p90), hit_rate=hit, errors=errors,
                            engine_share={"e0": share, "e1": 1 - share}, round=index,
                            by_tag={"vip": {"requests": 10, "ttft_p90": p90 / 2}},
                            prediction={"n": 10.0, "rel_err_p90": err})
        for index, (p90, hit, errors, share, err) in enumerate(
            [(200.0, 0.8, 0, 0.4, 0.2), (260.0, 0.9, 2, 0.6, 0.3), (220.0, 0.7, 0, 0.5, 0.1)]
        )
    ]  # fmt: skip
    median = median_of(runs)
    assert median.ttft_ms == {"p50": 110.0, "p90": 220.0, "p99": 440.0, "mean": 110.0}
    assert median.hit_rate == 0.8 and median.errors == 2 and median.requests == 1000
    assert median.engine_share == {"e0": 0.5, "e1": 0.5}
    assert median.by_tag == {"vip": {"requests": 10, "ttft_p90": 110.0}}
    assert median.prediction == {"n": 10.0, "rel_err_p90": 0.2}
    assert median.router == "prefix-cache" and median.round == -1
    spread = spread_of(runs)
    assert spread["ttft_p90"] == [200.0, 260.0] and spread["hit_rate"] == [0.7, 0.9]
    assert spread["rel_err_p90"] == [0.1, 0.3]
    assert "vip_ttft_p90" not in spread  # one class: the whole run's figure says it
    for index, run in enumerate(runs):
        run.by_tag["flood"] = {"requests": 5, "ttft_p90": 300.0 + index}
    assert spread_of(runs)["vip_ttft_p90"] == [100.0, 130.0]
    assert spread_of(runs)["flood_ttft_p90"] == [300.0, 302.0]
    assert median_of(runs[:1]) is runs[0]


def test_unique_prompts_share_nothing_and_vip_flood_mixes_both() -> None:
    unique = build("unique", SMALL, 3)
    heads = {" ".join(c.turns[0].messages[0]["content"].split()[:12]) for c in unique.conversations}
    assert len(heads) == unique.requests and not unique.shared_prefixes
    mixed = build("vip-flood", SMALL, 3)
    assert mixed.tags() == ["flood", "vip"]
    vips = [c for c in mixed.conversations if c.tag == "vip"]
    assert {c.turns[0].messages[0]["content"] for c in vips} == {
        vips[0].turns[0].messages[0]["content"]
    }


@pytest.mark.parametrize("name", WORKLOADS)
def test_fleet_holds_the_working_set_but_one_engine_at_most_a_quarter(name: str) -> None:
    script = build(name, WorkloadSize(), 0)
    plan = plan_fleet(script, 8, 1.0)
    tokens = plan.gpu_blocks * 16
    assert tokens * 8 >= script.working_set_tokens()
    assert tokens <= script.working_set_tokens() / 4 + 16
    assert capacity_rps(script, plan) > 0


@pytest.mark.parametrize(
    ("block_hash", "topic"), [("sim", "kv-events"), ("sha256_cbor", "")], ids=["sim", "vllm-like"]
)
async def test_oracle_sees_what_each_engine_caches(
    start_engine: StartEngine, block_hash: str, topic: str
) -> None:
    engines = [
        await start_engine(name=f"o{i}", block_hash=block_hash, topic=topic) for i in range(2)
    ]
    oracle = Oracle(
        [Engine(s.engine.config.name, s.url, s.engine.publisher.events_endpoint) for s in engines],
        block_hash=block_hash,
    )
    context = zmq.asyncio.Context()
    ready = asyncio.Event()
    listener = asyncio.create_task(oracle.listen(context, ready))
    try:
        await ready.wait()
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "the " * 80}]}
        keys = oracle.keys(body)
        async with httpx.AsyncClient(timeout=10) as client:

            async def subscribed() -> bool:
                # A subscription reaches a PUB some time after connecting (ZMQ's slow
                # joiner): reset the (empty) caches until each reset's event arrives.
                for server in engines:
                    await client.post(f"{server.url}/reset_prefix_cache")
                return all(engine.batches for engine in oracle.engines)

            await eventually(subscribed, what="the oracle's subscriptions are live")
            response = await client.post(
                f"{engines[1].url}/v1/chat/completions", json={**body, "max_tokens": 2}
            )
            assert response.status_code == 200
        await eventually(lambda: oracle.engines[1].matched(keys) == len(keys), what="stored")
        assert oracle.engines[0].matched(keys) == 0
        assert all(oracle.pick(body, {}) is oracle.engines[1] for _ in range(5))
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        context.term()


def test_vllm_router_kv_aware_gets_every_engines_events_from_vllm_like_engines() -> None:
    endpoints = [
        EngineEndpoint(f"e{i}", f"http://127.0.0.1:{8000 + i}", "sim-model",
                       f"tcp://127.0.0.1:{5557 + 2 * i}", f"tcp://127.0.0.1:{5558 + 2 * i}")
        for i in range(2)
    ]  # fmt: skip
    assert kv_aware_args(endpoints) == [
        "kv_aware", "--kv-event-block-size", "16", "--kv-event-model", "sim-model",
        "--kv-event-source", "http://127.0.0.1:8000=tcp://127.0.0.1:5557",
        "--kv-event-replay-source", "http://127.0.0.1:8000=tcp://127.0.0.1:5558",
        "--kv-event-source", "http://127.0.0.1:8001=tcp://127.0.0.1:5559",
        "--kv-event-replay-source", "http://127.0.0.1:8001=tcp://127.0.0.1:5560",
    ]  # fmt: skip
    assert not needs_vllm_like_engines(["prefix-cache", "oracle", "vllm-router"])
    assert needs_vllm_like_engines(["prefix-cache", "vllm-router-kv-aware"])
    plan = plan_fleet(build("chat", WorkloadSize(conversations=4, turns=2), 0), 4, 1.0)
    assert not any(a.startswith(("--block-hash", "--topic")) for a in plan.sim_args())
    vllm_like = plan.vllm_like()
    assert vllm_like.sim_args()[:3] == ["--block-hash", "sha256_cbor", "--topic="]


def _tiny_run(out_dir: Path, *args: str) -> str:
    """`kvgate bench routing --quick` on 2 engines with chat traffic (and `args`); its
    output, once it has exited 0."""
    command = [
        sys.executable, "-m", "gateway.cli", "bench", "routing", "--quick", "--engines", "2",
        "--workloads", "chat", "--out", str(out_dir), "--quiet", *args,
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_tiny_benchmark_run_prints_the_table_and_writes_results(tmp_path: Path) -> None:
    stdout = _tiny_run(tmp_path, "--routers", "prefix-cache,round-robin,sticky-rr,oracle",
                       "--time-scale", "4", "--replicas", "1,2",
                       "--slo-tpot-ms", "100000")  # fmt: skip
    assert "TTFT p50" in stdout and "hit rate" in stdout
    for name in ("prefix-cache", "round-robin", "sticky-rr", "oracle"):
        assert name in stdout
    assert "TTFT predictions" in stdout
    assert "prefix-cache ×2" in stdout  # kvgate's policies run again behind 2 replicas
    assert "2 replicas (sharing decisions) within 2 hit-rate points, 10 %" in stdout
    document = json.loads((tmp_path / "routing.json").read_text())
    replicated = [run for run in document["runs"] if run["replicas"] == 2]
    assert [run["router"] for run in replicated] == ["prefix-cache", "round-robin"]  # kvgate's
    assert "the sharing channel uses" in stdout
    for run in replicated:
        assert run["replica_sync"] is True
        assert 0 < run["replica_sync_cpu_share"] < 1  # measured by the replicas themselves
        assert run["requests"] == document["fleets"]["chat"]["requests"]
        assert run["errors"] == 0
    assert len(list((tmp_path / "logs" / "chat").glob("router-prefix-cache-*.log"))) == 2
    runs = {run["router"]: run for run in document["runs"] if run["replicas"] == 1}
    assert set(runs) == {"prefix-cache", "round-robin", "sticky-rr", "oracle"}
    assert runs["prefix-cache"]["prediction"]["n"] == runs["prefix-cache"]["requests"]
    assert runs["oracle"]["prediction"] == {}  # only kvgate predicts
    # every streamed answer's TPOT prediction came back with it, and a generous objective
    # sent with every request was met by every answer, whatever the router
    assert runs["prefix-cache"]["prediction"]["tpot_n"] == runs["prefix-cache"]["requests"]
    assert "TPOT objective met" in stdout
    assert all(run["tpot_met"] == 1.0 for run in runs.values())
    assert all(run["router_cpu_ms_per_request"] > 0 for run in runs.values())
    expected = document["fleets"]["chat"]["requests"]
    for run in runs.values():
        assert run["requests"] == expected and run["errors"] == 0
        assert run["hit_rate"] > 0  # the shared system prompts hit on any engine
        assert sum(run["engine_share"].values()) == pytest.approx(1.0)
    for png in ("ttft_cdf.png", "engine_share.png", "prediction_scatter.png"):
        assert (tmp_path / png).stat().st_size > 0


def test_repeat_runs_the_routers_again_in_reversed_order_and_reports_medians(
    tmp_path: Path,
) -> None:
    stdout = _tiny_run(tmp_path, "--routers", "prefix-cache,round-robin", "--time-scale", "4",
                       "--repeat", "2")  # fmt: skip
    assert "round 2 of 2" in stdout and "median of 2 rounds" in stdout
    assert "spread over the rounds" in stdout and "targets:" in stdout
    document = json.loads((tmp_path / "routing.json").read_text())
    order = [(run["round"], run["router"]) for run in document["runs"]]
    assert order == [(0, "prefix-cache"), (0, "round-robin"), (1, "round-robin"),
                     (1, "prefix-cache")]  # fmt: skip
    medians = {each["router"]: each for each in document["medians"]}
    assert set(medians) == {"prefix-cache", "round-robin"}
    for router, each in medians.items():
        assert each["rounds"] == 2 and each["errors"] == 0
        p90s = sorted(r["ttft_ms"]["p90"] for r in document["runs"] if r["router"] == router)
        assert each["spread"]["ttft_p90"] == p90s
        assert each["ttft_ms"]["p90"] == pytest.approx(sum(p90s) / 2)
    assert document["options"]["repeat"] == 2


def test_a_replica_killed_under_load_is_replaced_and_the_others_lose_nothing(
    tmp_path: Path,
) -> None:
    # Exits 0 although requests were lost on the killed one: that loss is expected.
    stdout = _tiny_run(tmp_path, "--routers", "prefix-cache", "--conversations", "24",
                       "--time-scale", "1", "--replicas", "2", "--kill-replica")  # fmt: skip
    assert "a replica killed: 0 requests failed on the others" in stdout
    (run,) = json.loads((tmp_path / "routing.json").read_text())["runs"]
    kill = run["replica_kill"]
    assert kill["killed"] is True
    assert kill["failed_on_survivors"] == 0
    assert run["errors"] == kill["lost_on_killed"]  # every failure is one the kill caused
    assert kill["killed_after_requests"] >= run["requests"] / 3
    assert 0 < kill["replacement_ready_s"] <= kill["down_s"]
    assert set(kill["replacement"]) == set(kill["survivors"]) == {"first_10s", "after_10s"}
    logs = tmp_path / "logs" / "chat"
    assert len(list(logs.glob("router-prefix-cache-*-replacement.log"))) == 1


def test_one_prompt_conversations_share_a_single_system_prompt() -> None:
    script = build("one-prompt", SMALL, 4)
    systems = {c.turns[0].messages[0]["content"] for c in script.conversations}
    assert len(systems) == 1 and len(script.shared_prefixes) == 1
    assert all(len(c.turns) == SMALL.turns for c in script.conversations)


def test_hetero_is_chat_on_a_fleet_whose_second_half_is_slower() -> None:
    script = build("hetero", SMALL, 5)
    assert script.conversations == build("chat", SMALL, 5).conversations
    mixed = plan_fleet(script, 4, 1.0, slowdown=slowdown("hetero"))
    even = plan_fleet(script, 4, 1.0)
    assert [mixed.slow(i) for i in range(4)] == [False, False, True, True]
    fast, slow = mixed.sim_args(0), mixed.sim_args(3)
    assert fast == even.sim_args(3)
    for flag in ("--prefill-us-per-token", "--decode-ms-per-token", "--request-overhead-ms"):
        ratio = float(slow[slow.index(flag) + 1]) / float(fast[fast.index(flag) + 1])
        assert ratio == pytest.approx(slowdown("hetero"))
    assert capacity_rps(script, even) / 2 < capacity_rps(script, mixed) < capacity_rps(script, even)


async def test_sticky_rr_keeps_each_conversation_on_its_first_engine(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engines = [await start_engine(name=f"pod{i}") for i in range(2)]
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [
        {"name": s.engine.config.name, "url": s.url, "events": s.engine.publisher.events_endpoint}
        for s in engines
    ]}))  # fmt: skip
    router = make_router("sticky-rr", pods, [], tmp_path, random.Random(0))
    await router.start()
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            await router.wait_ready(client)
            homes: dict[str, set[str]] = {}
            for turn in range(3):
                for conversation in ("a", "b", "c", "d"):
                    body = {"model": "sim-model", "max_tokens": 1, "messages": [
                        {"role": "user", "content": f"{conversation} turn {turn}"}]}  # fmt: skip
                    url = f"{router.url}/v1/chat/completions"
                    headers = {"x-session-id": conversation}
                    response = await client.post(url, json=body, headers=headers)
                    assert response.status_code == 200
                    homes.setdefault(conversation, set()).add(response.headers["x-kvgate-pod"])
    finally:
        await router.stop()
    assert all(len(pods_seen) == 1 for pods_seen in homes.values()), homes
    firsts = [next(iter(homes[c])) for c in ("a", "b", "c", "d")]
    assert firsts == ["pod0", "pod1", "pod0", "pod1"]  # first turns in turn


async def test_baseline_routers_relay_streams_whole_and_refuse_with_502_when_an_engine_is_down(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(name="up")
    down_port = free_port_block(1, random.Random(7))  # nothing listens there
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [
        {"name": "up", "url": engine.url, "events": engine.engine.publisher.events_endpoint},
        {"name": "down", "url": f"http://127.0.0.1:{down_port}",
         "events": engine.engine.publisher.events_endpoint},
    ]}))  # fmt: skip
    router = make_router("sticky-rr", pods, [], tmp_path, random.Random(0))
    await router.start()
    body = {"model": "sim-model", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "hello there"}]}  # fmt: skip
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            await router.wait_ready(client)
            url = f"{router.url}/v1/chat/completions"
            # first turns in turn: 12 concurrent streams, half of them to the engine that is down
            answers = await asyncio.gather(*(
                client.post(url, json=body, headers={"x-session-id": f"c{i}"})
                for i in range(12)
            ))  # fmt: skip
            direct = await client.post(f"{engine.url}/v1/chat/completions", json=body)
    finally:
        await router.stop()
    by_pod: dict[str, list[httpx.Response]] = {}
    for answer in answers:
        by_pod.setdefault(answer.headers.get("x-kvgate-pod", "none"), []).append(answer)
    assert len(by_pod["up"]) == 6 and all(a.status_code == 200 for a in by_pod["up"])
    events = [line for line in direct.text.splitlines() if line.startswith("data: ")]
    for answer in by_pod["up"]:  # every event of the stream, as the engine sends it
        relayed = [line for line in answer.text.splitlines() if line.startswith("data: ")]
        assert len(relayed) == len(events) and relayed[-1] == "data: [DONE]"
    refused = by_pod["none"]
    assert len(refused) == 6
    assert all(a.status_code == 502 and "error" in a.json() for a in refused)


def test_requests_go_to_the_replicas_in_turn_and_the_spec_round_trips() -> None:
    spec = LoadSpec(
        router_url="http://a", model="m", workload="chat", size=SMALL, seed=0, mode="open",
        rate=1.0, concurrency=0, time_scale=1.0, replica_urls=("http://a", "http://b"),
    )  # fmt: skip
    again = LoadSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec
    router = again.urls()
    assert [router() for _ in range(5)] == ["http://a", "http://b"] * 2 + ["http://a"]
    single = LoadSpec.from_json({**spec.to_json(), "replica_urls": []}).urls()
    assert {single() for _ in range(3)} == {"http://a"}


def _in_flight_at_each_start(records: list[RequestRecord]) -> list[tuple[float, int]]:
    """(start, requests in flight then, itself included) of each request, in start order."""
    return [
        (r.started, sum(1 for o in records if o.started <= r.started < o.ended))
        for r in sorted(records, key=lambda r: r.started)
    ]


@pytest.mark.parametrize("ramp_s", [0.0, 0.6])
async def test_closed_loop_users_join_one_by_one_over_the_ramp(
    start_engine: StartEngine, ramp_s: float
) -> None:
    engine = await start_engine(name="e0", latency=LatencyModel())  # requests take ≥ 20 ms
    users = 3
    spec = LoadSpec(
        router_url=engine.url, model="sim-model", workload="chat", size=SMALL, seed=0,
        mode="closed", rate=0.0, concurrency=users, time_scale=1.0, ramp_s=ramp_s,
    )  # fmt: skip
    script = build("chat", SMALL, 0)
    origin = time.perf_counter()
    records = await loadgen.run(spec, script)
    assert len(records) == script.requests and all(r.error is None for r in records)
    starts = _in_flight_at_each_start(records)
    if ramp_s == 0.0:  # every user at once: the first three requests overlap
        assert starts[users - 1][1] == users
        return
    step = ramp_s / users
    for started, in_flight in starts:  # user k joins k steps after the start, not before
        joined = min(users, int((started - origin) / step) + 1)
        assert in_flight <= joined, (started - origin, in_flight)


def test_closed_loop_users_join_at_the_open_loops_default_load_unless_told() -> None:
    options = RoutingOptions(
        workloads=["chat"], routers=["prefix-cache"], engines=8, loads=[0.8], mode="closed",
        concurrency=160, size=SMALL, time_scale=None, seed=0, out_dir=Path("unused"),
    )  # fmt: skip
    assert ramp_for(options, 100.0) == pytest.approx(160 / 80.0)  # 80 % of 100 req/s
    assert ramp_for(dataclasses.replace(options, ramp_s=0.0), 100.0) == 0.0  # all at once
    assert ramp_for(dataclasses.replace(options, ramp_s=3.0), 100.0) == 3.0


def test_a_routing_configs_profiles_run_beside_the_built_ins(tmp_path: Path) -> None:
    """`--routing-config`: its profiles are routers of the run, laid over the built-ins of
    every kvgate in it, and the run folder keeps the file."""
    config = tmp_path / "variants.toml"
    config.write_text(
        "[profiles.no-delay]\n"
        'filters = ["routable"]\n'
        'costs = ["ttft-cost", { type = "delay-cost", weight = 0.0 }, "arrival-cost"]\n'
        'placement = "first-turn"\n'
        'picker = "min-cost"\n'
    )
    out = tmp_path / "run"
    stdout = _tiny_run(out, "--routers", "no-delay,round-robin", "--time-scale", "4",
                       "--routing-config", str(config))  # fmt: skip
    assert "no-delay" in stdout
    document = json.loads((out / "routing.json").read_text())
    runs = {run["router"]: run for run in document["runs"]}
    assert set(runs) == {"no-delay", "round-robin"}
    assert runs["no-delay"]["errors"] == 0
    assert runs["no-delay"]["prediction"]["n"] == runs["no-delay"]["requests"]  # a cost model
    assert document["options"]["routing_config"] == str(config)
    assert (out / "routing-config.toml").read_text() == config.read_text()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--routers", "no-such-router"], "unknown router no-such-router; choose from"),
        (["--routers", "prefix-cache", "--routing-config", "{missing}"], "--routing-config"),
        (["--routers", "prefix-cache", "--routing-config", "{bad}"], "profiles.x.picker"),
    ],
)
def test_unknown_routers_and_bad_routing_configs_are_refused_before_anything_starts(
    tmp_path: Path, args: list[str], says: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[profiles.x]\nfilters = ["routable"]\n')  # no picker
    args = [a.format(missing=tmp_path / "absent.toml", bad=bad) for a in args]
    command = [sys.executable, "-m", "gateway.cli", "bench", "routing", "--quick",
               "--workloads", "chat", "--out", str(tmp_path / "run"), *args]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert says in out.stdout and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_the_vip_bar_is_also_checked_against_prefix_share_in_the_same_run() -> None:
    """The 266 ms bar is prefix-share's VIP p90 under the open loop at 80 %: beside it, the
    same policy under this run's load."""

    def vip_run(router: str, vip_p90: float) -> RunResult:
        run = dataclasses.replace(_result(router, 600.0), workload="vip-flood")
        return dataclasses.replace(run, by_tag={"vip": {"requests": 10, "ttft_p90": vip_p90}})

    lines = check_targets([vip_run("prefix-cache", 280.0), vip_run("prefix-share", 590.0)])
    assert "  ✗ VIP TTFT p90 no worse than before (266 ms): 280 ms" in lines
    assert "  ✓ VIP TTFT p90 no worse than prefix-share's here: 280 vs 590 ms" in lines
    lines = check_targets([vip_run("prefix-cache", 250.0), vip_run("prefix-share", 240.0)])
    assert "  ✗ VIP TTFT p90 no worse than prefix-share's here: 250 vs 240 ms" in lines
    assert not any(
        "prefix-share's here" in line for line in check_targets([vip_run("prefix-cache", 250.0)])
    )
