"""A client's W3C trace context at the gateway's edge: the validity rules of Trace Context
level 1, and what a simulated engine receives through a real gateway."""

from __future__ import annotations

import re

import pytest

from gateway.http.trace_context import MAX_TRACEPARENT, new_traceparent, valid_traceparent
from tests.gateway.conftest import MODEL, StartGateway

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"
FRESH = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00")

VALID_VALUES = [
    VALID,
    f"00-{TRACE}-{PARENT}-00",
    f"00-{TRACE}-{PARENT}-ff",  # version 00 ignores flags it does not know
    f"01-{TRACE}-{PARENT}-01",  # a later version, as long as version 00
    f"cc-{TRACE}-{PARENT}-01-what-the-future-holds",  # ... or with fields of its own
]
INVALID_VALUES = [
    "",
    "garbage",
    f"ff-{TRACE}-{PARENT}-01",  # version ff is forbidden
    f"00-{TRACE}-{PARENT}-01-extra",  # version 00 is exactly 55 characters
    f"00-{TRACE}-{PARENT}-01 ",
    f"00-{TRACE.upper()}-{PARENT}-01",  # lowercase hex only
    f"00-{TRACE}-{PARENT.upper()}-01",
    f"0A-{TRACE}-{PARENT}-01",
    f"00-{TRACE}-{PARENT}-0A",
    f"00-{'0' * 32}-{PARENT}-01",  # all-zero ids
    f"00-{TRACE}-{'0' * 16}-01",
    f"00-{TRACE[:-1]}-{PARENT}-01",  # field lengths 2-32-16-2
    f"00-{TRACE}0-{PARENT}-01",
    f"00-{TRACE}-{PARENT}0-01",
    f"00-{TRACE}-{PARENT}-1",
    f"0-{TRACE}-{PARENT}-01",
    f"00_{TRACE}_{PARENT}_01",
    f"01-{TRACE}-{PARENT}-01x",  # a later version: flags end the value or meet a dash
    f"01-{TRACE}-{PARENT}-0",  # ... and it is at least 55 characters
    f"01-{TRACE}-{PARENT}-01-" + "x" * MAX_TRACEPARENT,  # oversized
]


@pytest.mark.parametrize("value", VALID_VALUES)
def test_valid_traceparents(value: str) -> None:
    assert valid_traceparent(value.encode())


@pytest.mark.parametrize("value", INVALID_VALUES)
def test_invalid_traceparents(value: str) -> None:
    assert not valid_traceparent(value.encode())


def test_a_fresh_trace_is_valid_and_new_each_time() -> None:
    made = {new_traceparent() for _ in range(100)}
    assert len(made) == 100
    assert all(FRESH.fullmatch(value.decode()) and valid_traceparent(value) for value in made)


def invalid_headers(page: str, header: str) -> float:
    prefix = f'kvgate_invalid_headers_total{{header="{header}"}} '
    (line,) = [line for line in page.splitlines() if line.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


async def test_the_engine_gets_a_valid_trace_context_or_a_fresh_trace(
    start_gateway: StartGateway,
) -> None:
    """Through a real gateway to a simulated engine: a valid `traceparent` (and its
    `tracestate`) arrives unchanged; an invalid, oversized or repeated one arrives as a
    fresh trace without the `tracestate`, counted; a request without one gets none. A
    replaced request id is counted too."""
    gw = await start_gateway(engines=1)
    received = gw.engines[0].engine.received_trace_context
    async with gw.client() as client:
        page = (await client.get("/metrics")).text
        assert invalid_headers(page, "traceparent") == 0  # at 0 before the first
        assert invalid_headers(page, "x-request-id") == 0
        for value in VALID_VALUES:
            headers = {"traceparent": value, "tracestate": "client=7"}
            response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert response.status_code == 200, response.text
            assert received[-1] == (value, "client=7")
        sent = 0
        sendable = [value for value in INVALID_VALUES if value == value.strip()]  # HTTP's OWS
        for value in [*sendable, "00-" + "a" * 20_000]:
            headers = {"traceparent": value, "tracestate": "client=7"}
            response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert response.status_code == 200, (value, response.text)
            sent += 1
            traceparent, tracestate = received[-1]
            assert traceparent is not None and FRESH.fullmatch(traceparent), (value, traceparent)
            assert tracestate is None
        twice = [("traceparent", VALID), ("traceparent", f"00-{TRACE}-{PARENT}-00")]
        response = await client.post("/v1/chat/completions", json=CHAT, headers=twice)
        assert response.status_code == 200
        sent += 1
        traceparent, _ = received[-1]
        assert traceparent is not None and FRESH.fullmatch(traceparent)
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert received[-1] == (None, None)
        bad_id = {"x-request-id": "no spaces allowed"}
        response = await client.post("/v1/chat/completions", json=CHAT, headers=bad_id)
        assert response.headers["x-request-id"] != bad_id["x-request-id"]
        page = (await client.get("/metrics")).text
    assert invalid_headers(page, "traceparent") == sent
    assert invalid_headers(page, "x-request-id") == 1
