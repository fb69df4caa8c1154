"""`bench.harness.envoy_relay`: the load generators' Envoy in front of a real picker, with
real simulated engines behind — answers relayed whole through the stream, the picker's
cost model and booking fed by them, refusals and a vanished pod as the client's status."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from bench.harness.envoy_relay import EnvoyRelay
from tests.gateway.conftest import MODEL
from tests.gateway.epp.conftest import CHAT, Picker, StartPicker
from tests.helpers import eventually


def _chat(user: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 8},
                {"role": "user", "content": user}]  # fmt: skip
    return {"model": MODEL, "messages": messages, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip


async def _inflight(picker: Picker) -> float:
    names = [engine.engine.config.name for engine in picker.engines]
    return sum([await picker.metric(f'kvgate_inflight_requests{{pod="{n}"}}') for n in names])


async def test_streamed_answers_come_back_whole_and_feed_the_picker(
    start_picker: StartPicker,
) -> None:
    picker = await start_picker()
    async with httpx.AsyncClient(timeout=30) as client:
        relay = EnvoyRelay(picker.envoy, lambda: client, timeout_s=30)
        relayed = await asyncio.gather(
            *(relay.post_chat(CHAT, _chat(f"question {i}"), {"x-session-id": f"c{i}"})
              for i in range(3))
        )  # fmt: skip
    for each in relayed:
        answer = each.answer
        assert (answer.status, answer.error, answer.failure) == (200, None, None)
        assert answer.done and answer.token_times and answer.text
        assert answer.usage_int("completion_tokens") == len(answer.text) == 4
        assert answer.ttft_s is not None and 0 < answer.ttft_s <= answer.ended - answer.started
        assert each.endpoint in picker.endpoints()
        assert each.picked is not None  # the pick comes first, within the TTFT
        assert answer.started < each.picked < answer.started + answer.ttft_s
    assert await _inflight(picker) == 0  # each answer's end released its booking
    first_bytes = f'kvgate_time_to_first_byte_seconds_count{{model="{MODEL}"}}'
    assert await picker.metric(first_bytes) == 3  # the cost model saw each first byte
    assert await picker.metric('kvgate_epp_picks_total{result="picked"}') == 3


async def test_an_immediate_response_is_the_clients_answer(start_picker: StartPicker) -> None:
    picker = await start_picker(engines=1)
    async with httpx.AsyncClient(timeout=30) as client:
        relay = EnvoyRelay(picker.envoy, lambda: client, timeout_s=30)
        relayed = await relay.post_chat("/v1/embeddings", {"model": MODEL, "input": "x"})
    assert relayed.endpoint is None
    answer = relayed.answer
    assert (answer.status, answer.failure) == (404, "status")
    assert answer.error is not None and answer.error.startswith("HTTP 404: ")
    assert answer.headers["content-type"] == "application/json"


async def test_a_pod_gone_before_the_request_reaches_it_is_a_503(
    start_picker: StartPicker,
) -> None:
    """Picked and then refused by the pod (Envoy's upstream connect error), or refused by
    the picker once it saw the pod go: a 503 either way, nothing left booked."""
    picker = await start_picker(engines=1)
    await picker.engines[0].stop()
    async with httpx.AsyncClient(timeout=30) as client:
        relay = EnvoyRelay(picker.envoy, lambda: client, timeout_s=30)
        relayed = await relay.post_chat(CHAT, _chat("anyone there?"))
    answer = relayed.answer
    assert answer.status == 503 and answer.error is not None and not answer.token_times

    async def released() -> bool:
        return await _inflight(picker) == 0

    await eventually(released, what="the booking released")
