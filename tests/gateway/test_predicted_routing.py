"""Cost-model routing end to end: predictions on the wire, learning, SLOs, slow pods."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest

from gateway.routing import FEATURES
from predictor import CALIBRATED_CONTEXT_SHARE, TPOT_FEATURES
from simulator import LatencyModel
from tests.conftest import StartEngine
from tests.gateway.conftest import MODEL, Gateway, StartGateway, pod_entry


def stream_body(user: str, max_tokens: int = 2) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": True,
    }


async def stream(client: httpx.AsyncClient, user: str, **headers: str) -> httpx.Response:
    async with client.stream(
        "POST", "/v1/chat/completions", json=stream_body(user), headers=headers
    ) as response:
        await response.aread()
        return response


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text page (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{wanted}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_streamed_answers_carry_the_prediction_and_train_the_model(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2)
    async with gw.client() as client:
        for i in range(12):
            response = await stream(client, f"question number {i} " * 20)
            assert response.status_code == 200
            predicted = float(response.headers["x-kvgate-predicted-ttft-ms"])
            assert predicted > 0
        page = (await client.get("/metrics")).text
    cost = gw.state.router.cost
    assert sum(cost.answers(name) for name in ("e0", "e1")) == 12
    assert cost.fleet.observations == 12
    # every relayed chunk marked the end of an engine step: the steps were timed
    assert all(cost.step(name)[0] > 0 for name in ("e0", "e1") if cost.answers(name))
    assert cost.outstanding("e0") == (0.0, 0, 0) and cost.outstanding("e1") == (0.0, 0, 0)
    observed = sum(
        metric(page, "kvgate_ttft_prediction_error_seconds_count", pod=name)
        for name in ("e0", "e1")
    )
    assert observed == 12
    for plugin in ("routable", "slo-feasible", "min-cost", "pin-affinity"):
        assert metric(page, "kvgate_routing_plugin_seconds_count", plugin=plugin) == 12


async def test_a_slower_engine_gets_less_traffic(
    start_engine: StartEngine, start_gateway: StartGateway
) -> None:
    fast = await start_engine(name="fast", latency=LatencyModel(time_scale=2.0))
    slow = await start_engine(name="slow", latency=LatencyModel(time_scale=0.5))
    gw = await start_gateway(engines=0, pods=[pod_entry(fast), pod_entry(slow)])
    served: Counter[str] = Counter()

    async def user(index: int, client: httpx.AsyncClient) -> None:
        for turn in range(12):
            response = await stream(client, f"user {index} asks thing {turn}: " + "word " * 150)
            assert response.status_code == 200
            served[response.headers["x-kvgate-pod"]] += 1

    async with gw.client() as client:
        await asyncio.gather(*(user(i, client) for i in range(4)))
    assert served["slow"] > 0 or served["fast"] == 48
    assert served["fast"] >= 2 * served["slow"], served


async def test_ttft_objectives_are_counted_and_shed_when_asked(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2, slo_shed=True)
    async with gw.client() as client:
        bad = await client.post(
            "/v1/chat/completions", json=stream_body("hi"), headers={"x-slo-ttft-ms": "soon"}
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "x-slo-ttft-ms"
        met = await stream(client, "an easy one", **{"x-slo-ttft-ms": "60000"})
        assert met.status_code == 200
        shed = await client.post(
            "/v1/chat/completions", json=stream_body("hi"), headers={"x-slo-ttft-ms": "0.001"}
        )
        assert shed.status_code == 429
        assert int(shed.headers["retry-after"]) >= 1
        assert shed.json()["error"]["code"] == "slo_unreachable"
        page = (await client.get("/metrics")).text
    for outcome, count in (("predicted_met", 1), ("observed_met", 1), ("shed", 1)):
        assert metric(page, "kvgate_slo_ttft_total", outcome=outcome) == count, outcome
    assert metric(page, "kvgate_slo_ttft_total", outcome="predicted_missed") == 0


async def test_tpot_objectives_are_predicted_learned_counted_and_shed_when_asked(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2, slo_shed=True)
    objective = "x-slo-tpot-ms"
    async with gw.client() as client:
        bad = await client.post(
            "/v1/chat/completions", json=stream_body("hi"), headers={objective: "-1"}
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == objective
        body = stream_body("tell me a long story", max_tokens=8)
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={objective: "60000"}
        ) as met:
            await met.aread()
        assert met.status_code == 200
        assert float(met.headers["x-kvgate-predicted-tpot-ms"]) > 0
        shed = await client.post(
            "/v1/chat/completions", json=stream_body("hi"), headers={objective: "0.001"}
        )
        assert shed.status_code == 429
        assert shed.json()["error"]["code"] == "slo_unreachable"
        assert "TPOT" in shed.json()["error"]["message"]
        whole = {**stream_body("hi"), "stream": False}  # no time per token to meet
        unstreamed = await client.post(
            "/v1/chat/completions", json=whole, headers={objective: "0.001"}
        )
        assert unstreamed.status_code == 200
        assert "x-kvgate-predicted-tpot-ms" not in unstreamed.headers
        page = (await client.get("/metrics")).text
    for outcome, count in (("predicted_met", 1), ("observed_met", 1), ("shed", 1)):
        assert metric(page, "kvgate_slo_tpot_total", outcome=outcome) == count, outcome
    assert metric(page, "kvgate_slo_tpot_total", outcome="predicted_missed") == 0
    assert metric(page, "kvgate_slo_tpot_total", outcome="observed_missed") == 0
    learned = sum(
        metric(page, "kvgate_tpot_prediction_error_seconds_count", pod=name)
        for name in ("e0", "e1")
    )
    assert learned == 1 and gw.state.router.cost.tpot.fleet.observations == 1


async def test_admin_match_shows_each_pods_prediction(start_gateway: StartGateway) -> None:
    gw: Gateway = await start_gateway(engines=2)
    async with gw.admin() as admin:
        explained = (await admin.post("/admin/match", json=stream_body("explain " * 40))).json()
        least = (
            await admin.post(
                "/admin/match",
                json=stream_body("explain " * 40),
                headers={"x-kvgate-policy": "least-request"},
            )
        ).json()
    for view in (explained, least):  # predicted for every pod, whatever the policy
        for pod in view["pods"].values():
            assert pod["predicted_ttft_ms"] > 0
            prediction = pod["prediction"]
            assert prediction["own_uncached_tokens"] > 0
            # nothing cached: the prompt's attention over itself is work beyond its tokens
            uncached = prediction["own_uncached_tokens"]
            assert prediction["own_work_tokens"] == pytest.approx(
                uncached + CALIBRATED_CONTEXT_SHARE * uncached**2
            )
            assert set(prediction["terms_ms"]) == set(FEATURES)
            assert prediction["speed"] > 0 and prediction["step_remaining_ms"] >= 0
            # nothing queued on an idle fleet: sending it there delays nobody
            assert prediction["queued_requests"] == 0 and prediction["delay_to_queued_ms"] == 0
            total = sum(prediction["terms_ms"].values())
            assert abs(total - pod["predicted_ttft_ms"]) < 1e-6
            tpot = pod["tpot_prediction"]  # the prior's, nothing learned yet: its only stream
            assert tpot["decoding_sequences"] == 1 and tpot["decode_speed"] == 1.0
            assert set(tpot["terms_ms"]) == set(TPOT_FEATURES)
            assert sum(tpot["terms_ms"].values()) == pytest.approx(pod["predicted_tpot_ms"])


async def test_the_prior_scale_setting_reaches_the_predictions(
    start_gateway: StartGateway,
) -> None:
    plain = await start_gateway(engines=1)
    slower = await start_gateway(engines=1, cost_prior_scale=3.0)
    predicted = []
    for gw in (plain, slower):
        async with gw.admin() as admin:
            view = (await admin.post("/admin/match", json=stream_body("explain " * 40))).json()
        predicted.append(view["pods"]["e0"]["predicted_ttft_ms"])
    assert predicted[1] == pytest.approx(3.0 * predicted[0])


async def test_new_conversations_spread_and_their_later_turns_stay(
    start_gateway: StartGateway,
) -> None:
    """Conversations sharing one system prompt: the first turns spread over both engines
    (placement), each later turn goes where its conversation is."""
    # Real-time latencies: what each pod's prefill costs, not the loopback's noise, decides
    # (the learned speeds otherwise follow millisecond jitter).
    gw = await start_gateway(engines=2, engine_overrides={"latency": LatencyModel()})
    system = {"role": "system", "content": "You are a careful assistant. " * 60}
    homes: dict[int, str] = {}

    async def send(messages: list[dict[str, str]]) -> str:
        body = {"model": MODEL, "messages": messages, "max_tokens": 4, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            await response.aread()
            assert response.status_code == 200
            return response.headers["x-kvgate-pod"]

    async with gw.client() as client:
        for i in range(6):
            homes[i] = await send([system, {"role": "user", "content": f"question {i} " * 100}])
        assert set(homes.values()) == {"e0", "e1"}
        for i, home in homes.items():
            again = [
                system,
                {"role": "user", "content": f"question {i} " * 100},
                {"role": "assistant", "content": "an answer"},
                {"role": "user", "content": f"and a follow-up {i}"},
            ]
            assert await send(again) == home


async def test_a_new_conversation_is_placed_by_load_whatever_the_system_prompts_cold_prefill(
    start_gateway: StartGateway,
) -> None:
    """Two idle engines, new conversations sharing one ~470-token system prompt, sent one
    at a time: a first turn's window (`PLACEMENT_TOLERANCE`, 25 %) is over the predictions
    as if each pod held the system prompt, not over `/admin/match`'s `predicted_ttft_ms`.
    So once the holder is loaded beyond `load_tolerance` (and one request), a
    new conversation goes to the cold pod although it is predicted several times slower
    (docs/routing.md, placement)."""
    gw = await start_gateway(engines=2, engine_overrides={"latency": LatencyModel()})
    system = {"role": "system", "content": "You are a careful assistant. " * 65}

    def first_turn(i: int) -> dict[str, object]:
        # (a question of a few blocks: a first turn whose every full block a pod holds is
        # a repeat, not a placement)
        user = {"role": "user", "content": f"question {i}: what does this mean? " * 8}
        return {"model": MODEL, "messages": [system, user], "max_tokens": 4, "stream": True}

    async def explained(admin: httpx.AsyncClient, i: int, holders: int) -> dict[str, Any]:
        """/admin/match once `holders` pods are seen to hold the system prompt."""
        async with asyncio.timeout(10):
            while True:
                view: dict[str, Any] = (await admin.post("/admin/match", json=first_turn(i))).json()
                held = [pod for pod in view["pods"].values() if pod["matched_blocks"] > 0]
                if len(held) >= holders:
                    return view
                await asyncio.sleep(0.02)

    homes: list[str] = []
    async with gw.client() as client, gw.admin() as admin:
        for i in range(3):
            view = await explained(admin, i, holders=min(i, 1))
            async with client.stream("POST", "/v1/chat/completions", json=first_turn(i)) as r:
                await r.aread()
                assert r.status_code == 200
                homes.append(r.headers["x-kvgate-pod"])
                predicted = float(r.headers["x-kvgate-predicted-ttft-ms"])
            if i == 0:
                # a ~470-token system prompt, a ~70-token question
                assert 480 <= view["prompt_tokens"] <= 600
                continue
            holder = homes[0]
            cold = next(name for name in view["pods"] if name != holder)
            pods = view["pods"]
            assert pods[holder]["matched_blocks"] > 0 and pods[cold]["matched_blocks"] == 0
            # the cold pod is predicted far beyond 25 % of the holder, by /admin/match ...
            assert pods[cold]["predicted_ttft_ms"] > 2.0 * pods[holder]["predicted_ttft_ms"]
            if homes[-1] == cold:
                # ... and the new conversation went there all the same, knowingly
                assert predicted > 2.0 * pods[holder]["predicted_ttft_ms"]
                break
    # the second conversation (the holder, carrying one, at the edge of "one request" more
    # than the other) or at the latest the third goes to the cold pod
    assert homes[-1] != homes[0], homes
