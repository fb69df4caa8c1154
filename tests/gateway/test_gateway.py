"""The gateway end to end: real uvicorn on loopback in front of real simulated engines."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest

from gateway.settings import setting_names
from simulator import LatencyModel
from tests.gateway.conftest import ADMIN_TOKEN, MODEL, Gateway, StartGateway, pod_entry
from tests.helpers import eventually, free_port

SYSTEM = "You are a meticulous assistant who answers in great detail. " * 12
SLOW = {"latency": LatencyModel(time_scale=2.0)}  # ~12 ms per decoded token


def chat(user: str, *, system: str = SYSTEM, **extra: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
        **extra,
    }


async def post_chat(gw: Gateway, body: dict[str, object], **kwargs: object) -> httpx.Response:
    async with gw.client() as client:
        return await client.post("/v1/chat/completions", json=body, **kwargs)  # type: ignore[arg-type]


# -- OpenAI clients ------------------------------------------------------------------------


async def test_openai_sdk_sync_async_and_streaming(start_gateway: StartGateway) -> None:
    gw = await start_gateway()
    sync_client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    completion = await asyncio.to_thread(
        sync_client.chat.completions.create,
        model=MODEL,
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=5,
    )
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 5

    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    text = await client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=3)
    assert text.choices[0].text

    chunks = []
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream this"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        chunks.append(chunk)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 6
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6

    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    await client.close()
    sync_client.close()


async def test_decision_headers_on_every_proxied_response(start_gateway: StartGateway) -> None:
    gw = await start_gateway()
    response = await post_chat(gw, chat("first"))
    assert response.status_code == 200
    assert response.headers["x-kvgate-pod"] in {"e0", "e1"}
    assert response.headers["x-kvgate-policy"] == "prefix-cache"
    assert int(response.headers["x-kvgate-prompt-blocks"]) > 0
    assert response.headers["x-kvgate-cached-blocks"] == "0"
    for header in ("x-kvgate-policy", "routing-strategy"):
        picked = await post_chat(gw, chat("second"), headers={header: "round-robin"})
        assert picked.headers["x-kvgate-policy"] == "round-robin"
        assert picked.headers["x-kvgate-prompt-blocks"] == "0"  # no tokenization needed


# -- routing quality -----------------------------------------------------------------------


async def test_shared_prefix_sticks_to_one_pod_even_in_a_burst(start_gateway: StartGateway) -> None:
    # The heuristic policy: only router-side expected entries can keep this burst together
    # (the cost model spreads a burst once queueing costs more than the cache saves).
    gw = await start_gateway(engines=3, default_policy="prefix-share")
    burst = await asyncio.gather(*(post_chat(gw, chat(f"question {i}")) for i in range(6)))
    assert all(r.status_code == 200 for r in burst)
    pods = {r.headers["x-kvgate-pod"] for r in burst}
    assert len(pods) == 1  # the router's expected entries kept the burst together
    (pod,) = pods
    later = await post_chat(gw, chat("a later question"))
    assert later.headers["x-kvgate-pod"] == pod
    prompt_blocks = int(later.headers["x-kvgate-prompt-blocks"])
    assert int(later.headers["x-kvgate-cached-blocks"]) >= prompt_blocks - 1
    details = later.json()["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] >= (prompt_blocks - 1) * 16  # the engine agrees


async def test_unrelated_prompts_spread_over_the_fleet(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=3)
    used = Counter()
    for i in range(12):
        response = await post_chat(gw, chat("hi", system=f"Persona number {i}: " * 30))
        used[response.headers["x-kvgate-pod"]] += 1
    assert len(used) == 3
    assert max(used.values()) <= 8


async def test_hot_spot_guard_moves_traffic_off_a_busy_cache_holder(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(
        engines=2, engine_overrides=SLOW, hot_spot_margin=2, default_policy="prefix-share"
    )
    warm = await post_chat(gw, chat("warm the cache"))
    holder = warm.headers["x-kvgate-pod"]
    async with gw.client() as client:
        streams = []
        for i in range(2):  # two long generations keep the holder busy
            request = client.build_request(
                "POST", "/v1/chat/completions", json=chat(f"long {i}", max_tokens=400, stream=True)
            )
            response = await client.send(request, stream=True)
            assert response.headers["x-kvgate-pod"] == holder
            streams.append(response)
        try:
            await eventually(lambda: gw.state.registry.get(holder).inflight == 2, what="busy")
            moved = await client.post("/v1/chat/completions", json=chat("one more"))
            assert moved.headers["x-kvgate-pod"] != holder
            assert int(moved.headers["x-kvgate-cached-blocks"]) == 0
        finally:
            for response in streams:
                await response.aclose()


async def test_session_policy_keeps_a_session_on_its_pod(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=3)
    headers = {"x-kvgate-policy": "session", "x-session-id": "conversation-42"}
    first = await post_chat(gw, chat("turn 1", system="short"), headers=headers)
    pods = {first.headers["x-kvgate-pod"]}
    for turn in range(2, 6):
        response = await post_chat(
            gw, chat(f"turn {turn}", system=f"other {turn}"), headers=headers
        )
        pods.add(response.headers["x-kvgate-pod"])
    assert len(pods) == 1


# -- failures ------------------------------------------------------------------------------


async def test_a_dead_pod_is_failed_over_then_marked_unhealthy(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=2)
    await gw.engines[0].stop()
    for i in range(4):
        response = await post_chat(gw, chat(f"after the crash {i}"))
        assert response.status_code == 200
        assert response.headers["x-kvgate-pod"] == "e1"
    await eventually(lambda: not gw.state.registry.get("e0").healthy, what="e0 unhealthy")
    async with gw.admin() as admin:
        pods = {p["name"]: p for p in (await admin.get("/admin/pods")).json()["pods"]}
    assert pods["e0"]["healthy"] is False and pods["e1"]["healthy"] is True


def counted(page: str, counter: str) -> list[str]:
    """The series of `counter` that moved (each known one is exported at 0 beforehand)."""
    return [line for line in page.splitlines()
            if line.startswith(f"{counter}{{") and not line.endswith(" 0.0")]  # fmt: skip


async def test_engine_5xx_before_any_byte_is_retried_on_the_next_pod(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2)
    async with httpx.AsyncClient(base_url=gw.engines[0].url) as engine:
        await engine.post("/sim/faults", json={"fail_requests": 1, "status": 503})
    response = await post_chat(gw, chat("retry me"), headers={"x-kvgate-policy": "round-robin"})
    assert response.status_code == 200
    assert response.headers["x-kvgate-pod"] == "e1"
    async with gw.client() as client:
        metrics = (await client.get("/metrics")).text
    assert 'kvgate_upstream_retries_total{pod="e0"} 1.0' in metrics
    # Counted once, with the status the client saw; each attempt in its own counter.
    requests = counted(metrics, "kvgate_requests_total")
    assert requests == [
        'kvgate_requests_total{model="sim-model",pod="e1",policy="round-robin",status="200"} 1.0'
    ]
    assert 'kvgate_upstream_attempts_total{outcome="503",pod="e0"} 1.0' in metrics
    assert 'kvgate_upstream_attempts_total{outcome="200",pod="e1"} 1.0' in metrics


async def test_a_request_retried_after_a_connect_error_counts_once(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2, scrape_interval_s=30.0)  # e0 stays "healthy"
    await gw.engines[0].stop()
    response = await post_chat(gw, chat("anyone"), headers={"x-kvgate-policy": "round-robin"})
    assert response.status_code == 200 and response.headers["x-kvgate-pod"] == "e1"
    async with gw.client() as client:
        metrics = (await client.get("/metrics")).text
    requests = counted(metrics, "kvgate_requests_total")
    assert len(requests) == 1 and 'status="200"' in requests[0] and requests[0].endswith(" 1.0")
    assert 'kvgate_upstream_attempts_total{outcome="502",pod="e0"} 1.0' in metrics


async def test_failure_after_the_first_byte_is_passed_on(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1)
    async with httpx.AsyncClient(base_url=gw.engines[0].url) as engine:
        await engine.post("/sim/faults", json={"close_midstream": 1})
    with pytest.raises(httpx.HTTPError):
        async with gw.client() as client:
            body = chat("cut me", max_tokens=50, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                async for _ in response.aiter_bytes():
                    pass
    assert (await post_chat(gw, chat("fine again"))).status_code == 200
    await eventually(lambda: gw.state.registry.get("e0").inflight == 0, what="slot freed")


async def test_client_disconnect_cancels_the_upstream_request(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1, engine_overrides=SLOW)
    engine = gw.engines[0].engine
    async with gw.client() as client:
        body = chat("a long answer", max_tokens=2000, stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for _ in response.aiter_bytes():
                break  # got the first chunk; now hang up
    await eventually(lambda: gw.state.registry.get("e0").inflight == 0, what="slot freed")
    await eventually(
        lambda: not engine.scheduler.running and not engine.scheduler.waiting,
        what="the engine aborted the request",
    )


async def test_client_leaving_a_non_streamed_request_cancels_it_upstream(
    start_gateway: StartGateway,
) -> None:
    """The engine answers a non-streamed request only when it is done: the client leaving
    while it works must still reach the engine."""
    gw = await start_gateway(engines=1, engine_overrides=SLOW)
    engine = gw.engines[0].engine
    async with gw.client() as client:
        request = asyncio.ensure_future(
            client.post("/v1/chat/completions", json=chat("a long answer", max_tokens=2000))
        )
        await eventually(lambda: bool(engine.scheduler.running), what="the engine working")
        request.cancel()  # closes the client's connection
        with contextlib.suppress(asyncio.CancelledError):
            await request
    await eventually(lambda: gw.state.registry.get("e0").inflight == 0, what="slot freed")
    await eventually(
        lambda: not engine.scheduler.running and not engine.scheduler.waiting,
        what="the engine aborted the request",
    )


async def test_upstream_timeout_is_504(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1, upstream_timeout_s=0.5)
    async with httpx.AsyncClient(base_url=gw.engines[0].url) as engine:
        await engine.post("/sim/faults", json={"stall_ms": 3000, "seconds": 5})
    response = await post_chat(gw, chat("too slow"))
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "upstream_timeout"


async def test_unreachable_pods_are_502_then_503(start_gateway: StartGateway) -> None:
    dead = [
        {"name": f"dead{i}", "url": f"http://127.0.0.1:{free_port()}", "model": MODEL}
        for i in range(2)
    ]
    gw = await start_gateway(engines=0, pods=dead, scrape_interval_s=0.1, unhealthy_after=2)
    response = await post_chat(gw, chat("anyone?"))
    assert response.status_code in (502, 503)  # 502 if sent before the pods were judged
    await eventually(lambda: not gw.state.registry.routable(), what="both unhealthy")
    response = await post_chat(gw, chat("anyone?"))
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    async with gw.client() as client:
        ready = await client.get("/ready")  # the gateway can serve: it answers 503s itself
        assert ready.status_code == 200 and "no routable engine" in ready.json()["reason"]
        assert (await client.get("/health")).status_code == 200


@pytest.mark.parametrize(
    ("content", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
        (b'{"model": "sim-model", "messages": "hi"}', 400, "messages"),
        (b'{"model": "sim-model", "messages": [], "stream": 1}', 400, "stream"),
        (
            b'{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model",
        ),
    ],
)
async def test_bad_requests_get_openai_style_errors(
    start_gateway: StartGateway, content: bytes, status: int, param: str | None
) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        response = await client.post(
            "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
        )
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["type"]
    assert error["param"] == param


async def test_oversized_body_is_413_and_unknown_policy_is_400(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1, max_body_bytes=2048)
    response = await post_chat(gw, chat("x" * 5000))
    assert response.status_code == 413
    response = await post_chat(gw, chat("x"), headers={"x-kvgate-policy": "fastest"})
    assert response.status_code == 400
    assert "fastest" in response.json()["error"]["message"]


async def test_tokenizer_failure_degrades_to_load_only_routing(
    start_gateway: StartGateway,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    gw = await start_gateway(engines=2, tokenizer_endpoint=dead, tokenizer_timeout_s=0.5)
    response = await post_chat(gw, chat("still served"))
    assert response.status_code == 200
    assert response.headers["x-kvgate-prompt-blocks"] == "0"
    async with gw.client() as client:
        metrics = (await client.get("/metrics")).text
    assert 'kvgate_degraded_routing_total{reason="tokenizer"} 1.0' in metrics


# -- discovery -----------------------------------------------------------------------------


async def test_pods_file_changes_apply_without_restart(
    start_gateway: StartGateway, start_engine: object
) -> None:
    gw = await start_gateway(engines=2)
    third = await start_engine(name="e2")  # type: ignore[operator]
    gw.write_pods([pod_entry(s) for s in (*gw.engines, third)])
    await eventually(lambda: gw.state.registry.get("e2") is not None, what="e2 discovered")
    await eventually(lambda: gw.state.table.has_pod("e2"), what="e2 indexed")
    gw.write_pods([pod_entry(gw.engines[1]), pod_entry(third)])
    await eventually(lambda: gw.state.registry.get("e0") is None, what="e0 gone")
    # removal unsubscribes first (an await), then drops the pod's index entries
    await eventually(lambda: not gw.state.table.has_pod("e0"), what="e0's index dropped")
    assert gw.state.subscribers.status("e0") is None
    gw.pods_file.write_text("{ broken")  # an invalid file keeps the last good list
    await eventually(
        lambda: gw.state.metrics.prometheus.get_sample_value("kvgate_discovery_errors_total") == 1,
        what="reload error counted",
    )
    assert {s.name for s in gw.state.registry.all()} == {"e1", "e2"}
    used = {
        (await post_chat(gw, chat(f"q{i}", system=f"s{i}"))).headers["x-kvgate-pod"]
        for i in range(6)
    }
    assert used <= {"e1", "e2"}


async def test_sighup_makes_the_gateway_reread_its_pods_file(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=1)
    discovery = gw.state.discovery
    assert discovery.reloads == 0
    os.kill(os.getpid(), signal.SIGHUP)  # handled by the gateway's loop, not the default action
    await eventually(lambda: discovery.reloads == 1, what="reload on SIGHUP")


# -- admin, readiness, metrics -------------------------------------------------------------


async def test_admin_api_needs_the_token(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        assert (await client.get("/admin/pods")).status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert (await client.get("/admin/pods", headers=wrong)).status_code == 401
        basic = {"authorization": f"Basic {ADMIN_TOKEN}"}
        assert (await client.get("/admin/pods", headers=basic)).status_code == 401
    async with gw.admin() as admin:
        assert (await admin.get("/admin/pods")).status_code == 200


async def test_admin_api_is_off_without_a_token(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1, admin_token=None)
    async with gw.client() as client:
        response = await client.get("/admin/pods", headers={"authorization": "Bearer x"})
    assert response.status_code == 404


async def test_admin_index_equals_the_engine_and_match_explains_the_choice(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2)
    first = await post_chat(gw, chat("index me"))
    pod = first.headers["x-kvgate-pod"]
    engine = next(s for s in gw.engines if s.engine.config.name == pod)
    async with httpx.AsyncClient(base_url=engine.url) as client:
        sim = (await client.get("/sim/cache")).json()["tiers"]

    async def index_matches() -> bool:
        async with gw.admin() as admin:
            view = (await admin.get("/admin/index", params={"pod": pod})).json()
        return {k: set(v) for k, v in view["engine_hashes"].items()} == {
            k: set(v) for k, v in sim.items()
        }

    await eventually(index_matches, what="/admin/index == /sim/cache")
    async with gw.admin() as admin:
        view = (await admin.get("/admin/index", params={"pod": pod})).json()
        assert view["state"] == "whole" and view["last_seq"] is not None
        assert (await admin.get("/admin/index", params={"pod": "nope"})).status_code == 404
        follow_up = chat("index me")
        follow_up["messages"] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "index me"},
            {"role": "assistant", "content": "indexed"},
            {"role": "user", "content": "a new question"},
        ]
        explained = (await admin.post("/admin/match", json=follow_up)).json()
        # A new conversation is a placement: among pods loaded alike (both idle here) it goes
        # where its system prompt is cached; a pod loaded more would not get it
        # (tests/gateway/test_cost_model.py covers that side).
        placed = (await admin.post("/admin/match", json=chat("a new question " * 8))).json()
    assert placed["chosen"] == pod
    assert placed["pods"][pod]["matched_blocks"] > 0
    assert explained["chosen"] == pod
    assert explained["pods"][pod]["matched_blocks"] > 0
    assert explained["pods"][pod]["tiers"] == {"GPU": explained["pods"][pod]["matched_blocks"]}
    other = next(name for name in explained["pods"] if name != pod)
    assert explained["pods"][other]["matched_blocks"] == 0
    predicted = {name: view["predicted_ttft_ms"] for name, view in explained["pods"].items()}
    assert predicted[pod] < predicted[other]  # its cache saves the prefill


async def test_ready_and_metrics(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=2)
    async with gw.client() as client:
        await eventually(
            lambda: all(gw.state.subscribers.status(n).phase.value == "live" for n in ("e0", "e1")),
            what="subscribers live",
        )
        ready = await client.get("/ready")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        await client.post("/v1/chat/completions", json=chat("count me"))
        text = (await client.get("/metrics")).text
    for name in (
        "kvgate_requests_total",
        "kvgate_decision_seconds_bucket",
        "kvgate_prompt_blocks_total",
        "kvgate_matched_blocks_total",
        "kvgate_inflight_requests",
        "kvgate_tokenizer_requests_total",
        "kvgate_subscriber_connected",
        "kvgate_subscriber_last_seq",
        "kvgate_subscriber_degraded",
        "kvgate_subscriber_replays_total",
        "kvgate_subscriber_broken_chain_blocks_total",
        "kvgate_index_size",
        "kvgate_index_events_total",
        "kvgate_pod_healthy",
        "kvgate_upstream_first_byte_seconds_bucket",
    ):
        assert name in text, name


async def test_streamed_chunks_pass_through_unbuffered_on_a_reused_connection(
    start_gateway: StartGateway,
) -> None:
    # A behaviour check, not a timing claim: every chunk reaches the client while the
    # engine is still generating the rest, i.e. the gateway holds nothing back.
    gw = await start_gateway(engines=1, engine_overrides=SLOW)
    scheduler = gw.engines[0].engine.scheduler
    async with gw.client() as client:
        for attempt in range(2):  # the second request reuses the kept-alive connection
            body = chat(f"stream {attempt}", max_tokens=30, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                lines = response.aiter_lines()
                first = await anext(lines)
                while not first.startswith("data:"):
                    first = await anext(lines)
                assert scheduler.running, "first chunk arrived only after the engine finished"
                rest = [line async for line in lines if line.startswith("data:")]
            assert rest[-1] == "data: [DONE]"
            assert len(rest) >= 25


async def test_serve_refuses_invalid_configuration(tmp_path: Path) -> None:
    bad_pods = tmp_path / "pods.json"
    bad_pods.write_text('{"pods": [{"name": "p", "url": "ftp://x", "model": "m"}]}')
    good_pods = tmp_path / "good.json"
    good_pods.write_text('{"pods": []}')
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--pods", str(bad_pods),
        env={"PATH": "/usr/bin:/bin"}, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "pods[0].url" in stderr.decode() and "ftp://x" in stderr.decode()
    cases = {
        "AIBRIX_REMOTE_TOKENIZER_TIMEOUT": ("forever", "Go-style"),
        "AIBRIX_SYNC_MAX_CONTEXTS": ("-5", "an integer in 1..2147483647"),
        "KVGATE_DEFAULT_POLICY": ("fastest", "prefix-cache"),
        "KVGATE_TIER_WEIGHTS": ("GPU=2", "TIER=WEIGHT"),
    }
    for variable, (value, allowed) in cases.items():
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "serve", "--pods", str(good_pods),
            env={"PATH": "/usr/bin:/bin", variable: value},
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
        message = stderr.decode()
        assert process.returncode == 2, message
        assert variable in message and repr(value) in message and allowed in message, message


async def test_serve_warns_of_unread_variables_and_fails_at_once_on_a_taken_port(
    tmp_path: Path,
) -> None:
    pods = tmp_path / "pods.json"
    pods.write_text('{"pods": []}')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "serve", "--pods", str(pods),
            "--port", str(port), "--log-level", "info",
            env={"PATH": "/usr/bin:/bin", "KVGATE_PROT": "8080",
                 "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR": "2"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    output = stdout.decode() + stderr.decode()
    assert process.returncode == 1, output
    assert f"cannot listen on 127.0.0.1:{port}" in output
    assert "gateway ready" not in output  # the lifespan never ran: nothing subscribed
    for typo in ("KVGATE_PROT", "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR"):  # unread: said
        assert f"{typo} is set but kvgate reads no such setting" in output


async def test_serve_reads_a_config_file_the_environment_overrides(tmp_path: Path) -> None:
    pods = tmp_path / "pods.json"
    pods.write_text('{"pods": []}')

    async def serve(config: Path, **env: str) -> tuple[int | None, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "serve", "--pods", str(pods),
            "--config", str(config), env={"PATH": "/usr/bin:/bin", **env},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode, stdout.decode() + stderr.decode()

    with socket.socket() as taken, socket.socket() as other:
        for sock in (taken, other):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        port, env_port = taken.getsockname()[1], other.getsockname()[1]
        toml = tmp_path / "kvgate.toml"
        toml.write_text(f"KVGATE_PORT = {port}\nKVGATE_SLO_SHED = true\n")
        code, output = await serve(toml)  # the file's port (taken: fails at once)
        assert code == 1 and f"127.0.0.1:{port}" in output, output
        code, output = await serve(toml, KVGATE_PORT=str(env_port))  # the environment wins
        assert code == 1 and f"127.0.0.1:{env_port}" in output, output
        yaml_file = tmp_path / "kvgate.yaml"
        yaml_file.write_text(f"KVGATE_PORT: {port}\n")
        code, output = await serve(yaml_file)
        assert code == 1 and f"127.0.0.1:{port}" in output, output
    bad = tmp_path / "bad.toml"
    bad.write_text("KVGATE_PROT = 8080\n")
    code, output = await serve(bad)
    assert code == 2 and "KVGATE_PROT" in output and "a setting's name" in output, output
    bad.write_text('KVGATE_DEFAULT_POLICY = "fastest"\n')
    code, output = await serve(bad)
    assert code == 2 and "KVGATE_DEFAULT_POLICY" in output, output


def test_serve_help_lists_every_setting() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    text = " ".join(shown.stdout.split())
    names = setting_names()
    assert len(names) > 50
    assert all(name in text for name in names), [n for n in names if n not in text]
