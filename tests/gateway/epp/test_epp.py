"""`kvgate epp` played by Envoy's side of ext_proc (xds-protos' own stubs over a real gRPC
channel), with real simulated engines behind: each body mode, the pick's header and
metadata, prefix affinity, the subset hint, refusals, malformed streams, a pod leaving and
a client cancelling mid-answer, health, counters."""

from __future__ import annotations

import asyncio
import json

import grpc
import httpx
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.epp.client import Answer, request_pick
from gateway.epp.protocol import BodyMode
from gateway.epp.server import SERVICE
from simulator import LatencyModel
from tests.gateway.conftest import MODEL, pod_entry
from tests.gateway.epp.conftest import CHAT, Picker, StartPicker, chat, exchange
from tests.helpers import eventually

MODES: list[tuple[BodyMode, bool]] = [
    ("FULL_DUPLEX_STREAMED", False),
    ("STREAMED", True),  # send_body_without_waiting_for_header_response
    ("STREAMED", False),
    ("BUFFERED", False),
]


def immediate(answers: list[Answer]) -> Answer:
    assert answers[-1].kind == "immediate_response", answers
    return answers[-1]


@pytest.mark.parametrize(("mode", "body_first"), MODES)
async def test_each_body_mode_names_the_endpoint_and_relays_the_answer(
    start_picker: StartPicker, mode: BodyMode, body_first: bool
) -> None:
    picker = await start_picker()
    body = chat("hello", stream=True)
    done = await exchange(picker, body, mode=mode, chunks=3, body_first=body_first)
    assert done.endpoint in picker.endpoints()
    named = next(a for a in done.request_answers if a.destination)
    assert named.metadata_destination == named.destination == done.endpoint
    assert named.clear_route_cache
    assert b"data: [DONE]" in done.answer
    if mode == "FULL_DUPLEX_STREAMED":  # the body goes back unchanged, then the answer
        assert named.kind == "request_headers"
        echoed = b"".join(a.body or b"" for a in done.request_answers if a.kind == "request_body")
        assert echoed == body
        relayed = b"".join(a.body or b"" for a in done.response_answers[1:])
        assert relayed == done.answer and done.response_answers[-1].end_of_stream
    elif mode == "BUFFERED" or not body_first:
        assert named.kind == "request_body"  # Envoy holds the headers until this answer
    else:
        assert named.kind == "request_headers"
        assert [a.kind for a in done.request_answers[1:]] == ["request_body"] * 3
    pod = picker.endpoints()[done.endpoint]
    assert await picker.metric(f'kvgate_inflight_requests{{pod="{pod}"}}') == 0
    sample = (
        f'kvgate_requests_total{{model="{MODEL}",pod="{pod}",policy="prefix-cache",status="200"}}'
    )
    assert await picker.metric(sample) == 1
    assert await picker.metric('kvgate_epp_picks_total{result="picked"}') == 1
    assert await picker.metric(f'kvgate_time_to_first_byte_seconds_count{{model="{MODEL}"}}') == 1


async def test_counters_exist_at_zero_before_any_stream(start_picker: StartPicker) -> None:
    picker = await start_picker(engines=1)
    for sample in ('kvgate_epp_picks_total{result="picked"}',
                   'kvgate_epp_picks_total{result="refused"}',
                   'kvgate_epp_stream_errors_total{code="INVALID_ARGUMENT"}',
                   'kvgate_epp_stream_errors_total{code="RESOURCE_EXHAUSTED"}',
                   "kvgate_epp_pick_seconds_count"):  # fmt: skip
        assert await picker.metric(sample) == 0


async def test_a_conversation_s_next_turn_goes_to_the_pod_holding_it(
    start_picker: StartPicker,
) -> None:
    picker = await start_picker(engines=3)
    system = "You are a meticulous assistant who answers with care. " * 12
    first = await exchange(picker, chat("What is a KV cache?", system=system))
    reply = json.loads(first.answer)["choices"][0]["message"]["content"]
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is a KV cache?"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And why does routing matter for it?"},
    ]
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4}).encode()
    second = await exchange(picker, body)
    assert second.endpoint == first.endpoint


async def test_the_subset_hint_is_honoured_in_list_and_text_form(start_picker: StartPicker) -> None:
    picker = await start_picker(engines=3)
    endpoints = sorted(picker.endpoints())
    for i in range(4):
        done = await exchange(picker, chat(f"question {i}"), subset=[endpoints[2]])
        assert done.endpoint == endpoints[2]
    two = f"{endpoints[0]}, {endpoints[1]}"
    for i in range(4):
        done = await exchange(picker, chat(f"other {i}"), subset=two, mode="BUFFERED")
        assert done.endpoint in endpoints[:2]
    host = endpoints[1].rpartition(":")[0]  # a bare ip: each of its ports (all of them here)
    assert (await exchange(picker, chat("bare"), subset=[host])).endpoint in endpoints


@pytest.mark.parametrize("subset", [[], ["10.9.9.9:8000"]])
async def test_an_empty_or_foreign_subset_is_a_503(
    start_picker: StartPicker, subset: list[str]
) -> None:
    picker = await start_picker()
    answers = await request_pick(picker.envoy.stream(), CHAT, chat("hi"), subset=subset)
    refused = immediate(answers)
    assert refused.status == 503
    assert json.loads(refused.immediate_body)["error"]["type"] == "service_unavailable"
    assert refused.headers["retry-after"] == "1"
    assert await picker.metric('kvgate_requests_rejected_total{reason="NoRoutablePod"}') == 1
    assert await picker.metric('kvgate_epp_picks_total{result="refused"}') == 1


@pytest.mark.parametrize(
    ("path", "body", "status", "reason"),
    [
        (
            CHAT,
            json.dumps(
                {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            404,
            "ModelNotFound",
        ),
        (CHAT, b"{not json", 400, "BadRequest"),
        (CHAT, json.dumps({"model": MODEL, "messages": []}).encode(), 400, "BadRequest"),
        ("/v1/embeddings", json.dumps({"model": MODEL, "input": "x"}).encode(), 404, "NotFound"),
    ],
)
async def test_a_request_the_proxy_refuses_gets_its_answer_as_an_immediate_response(
    start_picker: StartPicker, path: str, body: bytes, status: int, reason: str
) -> None:
    picker = await start_picker(engines=1)
    modes: tuple[BodyMode, ...] = ("FULL_DUPLEX_STREAMED", "BUFFERED")
    for mode in modes:
        answers = await request_pick(picker.envoy.stream(), path, body, mode=mode)
        refused = immediate(answers)
        assert refused.status == status
        assert refused.headers["content-type"] == "application/json"
        error = json.loads(refused.immediate_body)["error"]
        assert error["code"] in (status, "model_not_found") and error["message"]
    assert await picker.metric(f'kvgate_requests_rejected_total{{reason="{reason}"}}') == 2


async def test_no_routable_pod_is_a_503_and_health_follows(start_picker: StartPicker) -> None:
    picker = await start_picker()
    channel = grpc.aio.insecure_channel(picker.target)
    health = health_pb2_grpc.HealthStub(channel)

    async def status(service: str) -> int:
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        return int(reply.status)

    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    for service in ("", SERVICE, "readiness", "liveness"):
        assert await status(service) == serving
    picker.write_pods([pod_entry(s, ready=False) for s in picker.engines])
    picker.state.discovery.request_reload()

    async def drained() -> bool:
        return bool(await status(SERVICE) == not_serving)

    await eventually(drained, what="NOT_SERVING")
    assert await status("liveness") == serving
    refused = immediate(await request_pick(picker.envoy.stream(), CHAT, chat("hi")))
    assert refused.status == 503
    await channel.close()


async def test_malformed_streams_end_with_invalid_argument(start_picker: StartPicker) -> None:
    picker = await start_picker(engines=1)
    cases = [
        [pb.ProcessingRequest()],  # carries nothing
        [pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))],
        [pb.ProcessingRequest(response_headers=pb.HttpHeaders())],
    ]
    for messages in cases:
        stream = picker.envoy.stream()
        for message in messages:
            await stream.send_raw(message)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stream.read()
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await picker.metric('kvgate_epp_stream_errors_total{code="INVALID_ARGUMENT"}') == 3
    assert (await exchange(picker, chat("still fine"))).endpoint  # the server lives on


async def test_an_oversized_body_is_a_413_and_an_oversized_message_resource_exhausted(
    start_picker: StartPicker,
) -> None:
    picker = await start_picker(engines=1, max_body_bytes=4096)
    body = json.dumps({"model": MODEL, "prompt": "x" * 6000}).encode()
    refused = immediate(await request_pick(picker.envoy.stream(), CHAT, body, chunks=3))
    assert refused.status == 413
    assert await picker.metric('kvgate_requests_rejected_total{reason="PayloadTooLarge"}') == 1
    stream = picker.envoy.stream()
    await stream.request_headers(CHAT)
    await stream.request_body(b"x" * (4096 + 128 * 1024), end_of_stream=True)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await stream.read()
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def _stream_then_drop(picker: Picker, *, stop_pod: bool) -> str:
    """Pick a long streamed answer, relay a few chunks, then the data plane drops the
    ext_proc stream (its client left, or the pod went away); the pod's name."""
    stream = picker.envoy.stream()
    body = chat("tell me a long story", max_tokens=400, stream=True)
    answers = await request_pick(stream, CHAT, body)
    endpoint = next(a.destination for a in answers if a.destination)
    assert endpoint is not None
    pod = picker.endpoints()[endpoint]
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", f"http://{endpoint}{CHAT}", content=body) as response,
    ):
        await stream.response_headers(response.status_code)
        await stream.read()
        relayed = 0
        async for part in response.aiter_raw():
            await stream.response_body(part, end_of_stream=False)
            await stream.read()
            relayed += 1
            if relayed == 3:
                break
        assert await picker.metric(f'kvgate_inflight_requests{{pod="{pod}"}}') == 1
        if stop_pod:  # the pod leaves: discovery drops it and its connection breaks
            others = [pod_entry(s) for s in picker.engines if s.engine.config.name != pod]
            picker.write_pods(others)
            picker.state.discovery.request_reload()
            await eventually(lambda: picker.state.registry.get(pod) is None, what="pod gone")
        stream.cancel()
    return pod


@pytest.mark.parametrize("stop_pod", [False, True], ids=["client-cancels", "pod-leaves"])
async def test_a_stream_dropped_mid_answer_releases_its_charge_once(
    start_picker: StartPicker, stop_pod: bool
) -> None:
    picker = await start_picker(engine_overrides={"latency": LatencyModel(time_scale=2.0)})
    pod = await _stream_then_drop(picker, stop_pod=stop_pod)
    inflight = f'kvgate_inflight_requests{{pod="{pod}"}}'

    async def released() -> bool:
        return await picker.metric(inflight) == 0

    await eventually(released, what="the in-flight charge released")
    sample = (f'kvgate_requests_total{{model="{MODEL}",pod="{pod}",policy="prefix-cache",'
              'status="client_disconnect"}')  # fmt: skip
    assert await picker.metric(sample) == 1
    await asyncio.sleep(0.2)  # nothing releases it a second time
    assert await picker.metric(inflight) == 0
    assert await picker.metric(sample) == 1


async def test_streams_beyond_the_concurrency_limit_get_a_429(start_picker: StartPicker) -> None:
    """`KVGATE_MAX_CONCURRENT_REQUESTS` bounds ext_proc streams as it bounds proxied
    requests: the one beyond gets the proxy's 429 with Retry-After; once a stream ends, a
    new one is served."""
    picker = await start_picker(engines=1, max_concurrent_requests=2)
    held = [picker.envoy.stream() for _ in range(2)]
    for stream in held:  # two requests whose bodies have not arrived: they hold their slots
        await stream.request_headers(CHAT)
    await eventually(lambda: _active(picker) == 2, what="two streams open")
    refused = immediate(await request_pick(picker.envoy.stream(), CHAT, chat("one more")))
    assert refused.status == 429 and refused.headers["retry-after"] == "1"
    assert json.loads(refused.immediate_body)["error"]["type"] == "rate_limit_error"
    assert await picker.metric('kvgate_requests_rejected_total{reason="TooManyRequests"}') == 1
    held[0].cancel()
    await eventually(lambda: _active(picker) == 1, what="a slot freed")
    assert (await exchange(picker, chat("now there is room"))).endpoint
    held[1].cancel()


def _active(picker: Picker) -> int:
    processor = picker.service.processor
    assert processor is not None
    return processor.active


async def test_a_body_that_never_ends_gets_a_408(start_picker: StartPicker) -> None:
    """The slow-loris bound of the proxy (`KVGATE_BODY_TIMEOUT`) holds for a stream: its
    body must arrive whole in time, else an ImmediateResponse 408 ends it."""
    picker = await start_picker(engines=1, body_timeout_s=0.5)
    stream = picker.envoy.stream()
    await stream.request_headers(CHAT)
    await stream.request_body(chat("half")[:10], end_of_stream=False)
    answer = await asyncio.wait_for(stream.read(), 10)
    assert answer is not None and answer.kind == "immediate_response" and answer.status == 408
    assert await picker.metric('kvgate_requests_rejected_total{reason="RequestTimeout"}') == 1
    await eventually(lambda: _active(picker) == 0, what="the stream gone")


async def test_an_answer_that_stalls_releases_its_charge_as_a_504(
    start_picker: StartPicker,
) -> None:
    """Once picked, each next message of the answer must come within
    `KVGATE_UPSTREAM_TIMEOUT`, as the proxy waits for an engine's next byte: a data plane
    that goes silent does not hold the pod's in-flight charge for ever."""
    picker = await start_picker(engines=1, upstream_timeout_s=0.5)
    stream = picker.envoy.stream()
    answers = await request_pick(stream, CHAT, chat("and then silence"))
    endpoint = next(a.destination for a in answers if a.destination)
    assert endpoint is not None
    pod = picker.endpoints()[endpoint]
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await asyncio.wait_for(stream.read(), 10)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await picker.metric(f'kvgate_inflight_requests{{pod="{pod}"}}') == 0
    sample = (f'kvgate_requests_total{{model="{MODEL}",pod="{pod}",policy="prefix-cache",'
              'status="504"}')  # fmt: skip
    assert await picker.metric(sample) == 1
    assert await picker.metric(f'kvgate_upstream_errors_total{{kind="timeout",pod="{pod}"}}') == 1


async def test_the_client_is_read_from_x_forwarded_for_as_the_proxy_reads_it(
    start_picker: StartPicker,
) -> None:
    """What is learned per client (bytes per prompt token) is keyed by the address Envoy
    forwarded; an entry that is no address is not believed (the data plane's own then)."""
    picker = await start_picker(engines=1)

    def padded(indent: int) -> bytes:  # more body bytes a prompt token
        return json.dumps(json.loads(chat("padded")), indent=indent).encode()

    sent = {"203.0.113.7": chat("plain"), "198.51.100.9": padded(40),
            "not-an-address": padded(120)}  # fmt: skip
    for address, body in sent.items():
        await exchange(picker, body, headers={"x-forwarded-for": f"10.9.9.9, {address}"})
    sizes = picker.state.router.prompt_sizes
    plain, wide = (sizes.bytes_per_token(MODEL, "addr:" + a) for a in list(sent)[:2])
    assert wide > plain
    assert sizes.bytes_per_token(MODEL, "addr:127.0.0.1") > wide  # the spoof's, as the peer's
    # never learned: the median of the three clients that were
    assert sizes.bytes_per_token(MODEL, "addr:not-an-address") == wide
