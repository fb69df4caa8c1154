"""A pod that is gone does not hold its clients until the upstream timeout: after the
grace period its in-flight streams are cut (so clients can retry), counted and logged."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from simulator import LatencyModel
from tests.gateway.conftest import MODEL, Gateway, StartGateway, pod_entry
from tests.helpers import eventually

SLOW = {"latency": LatencyModel(time_scale=0.5)}  # ~50 ms per generated token


async def test_a_stream_of_a_pod_that_left_discovery_is_cut_after_the_grace(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2, engine_overrides=SLOW, dead_pod_grace_s=0.3)
    body = {"model": MODEL, "stream": True, "max_tokens": 2000,
            "messages": [{"role": "user", "content": "a very long story"}]}  # fmt: skip
    headers = {"x-kvgate-policy": "round-robin"}  # e0 first
    received = 0
    async with gw.client() as client:
        async with client.stream("POST", "/v1/chat/completions", json=body,
                                 headers=headers) as response:  # fmt: skip
            assert response.status_code == 200 and response.headers["x-kvgate-pod"] == "e0"
            with pytest.raises(httpx.HTTPError):
                async for chunk in response.aiter_bytes():
                    received += len(chunk)
                    if received and gw.state.registry.get("e0") is not None:
                        gw.write_pods([pod_entry(gw.engines[1])])  # e0 leaves discovery
        page = (await client.get("/metrics")).text
    assert received > 0  # the stream was live, then cut (not answered in full)
    assert 'kvgate_dead_pod_cuts_total{pod="e0"} 1.0' in page
    assert 'status="cut"' in page


async def test_a_pod_back_within_the_grace_loses_nothing(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1, engine_overrides=SLOW, dead_pod_grace_s=30.0)
    body = {"model": MODEL, "stream": True, "max_tokens": 20,
            "messages": [{"role": "user", "content": "a short story"}]}  # fmt: skip
    async with gw.client() as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            gw.state.registry.get("e0").healthy = False  # as the scraper marks it
            chunks = [chunk async for chunk in response.aiter_bytes()]
            gw.state.registry.get("e0").healthy = True
        assert b"[DONE]" in b"".join(chunks)
    await asyncio.sleep(0)
    assert (
        gw.state.metrics.prometheus.get_sample_value("kvgate_dead_pod_cuts_total", {"pod": "e0"})
        == 0
    )


def _story(max_tokens: int, *, stream: bool = True) -> dict[str, object]:
    return {"model": MODEL, "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "a very long story"}]}  # fmt: skip


async def _only_e0(gw: Gateway) -> None:
    gw.write_pods([pod_entry(gw.engines[0])])
    await eventually(lambda: gw.state.registry.get("e1") is None, what="e1 left discovery")


async def test_only_exchanges_in_flight_at_the_cut_are_counted(
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Finished requests and a cancel storm leave nothing in flight; of what is in flight
    when the pod goes, each exchange is cut once, and the counter and the log line say
    exactly how many clients saw the error."""
    gw = await start_gateway(engines=2, engine_overrides=SLOW, dead_pod_grace_s=0.3)
    await _only_e0(gw)
    upstream = gw.state.upstream
    async with gw.client() as client:
        finished = await asyncio.gather(*(
            client.post("/v1/chat/completions", json=_story(2, stream=False)) for _ in range(20)
        ))  # fmt: skip
        assert [r.status_code for r in finished] == [200] * 20
        for _ in range(10):  # a cancel storm: each client goes after its first bytes
            async with client.stream("POST", "/v1/chat/completions", json=_story(2000)) as r:
                assert r.status_code == 200
                await anext(r.aiter_bytes())
        live = 3

        async def stream(first: asyncio.Event) -> bool:
            """True when the stream broke off (the client saw the cut)."""
            async with client.stream("POST", "/v1/chat/completions", json=_story(500)) as r:
                assert r.headers["x-kvgate-pod"] == "e0"
                try:
                    async for _chunk in r.aiter_bytes():
                        first.set()
                except httpx.HTTPError:
                    return True
            return False

        firsts = [asyncio.Event() for _ in range(live)]
        streams = [asyncio.create_task(stream(first)) for first in firsts]
        await asyncio.wait_for(asyncio.gather(*(first.wait() for first in firsts)), 30)
        await eventually(lambda: upstream.in_flight("e0") == live,
                         what="the cancelled exchanges ended")  # fmt: skip
        page = (await client.get("/metrics")).text
        assert 'kvgate_dead_pod_cuts_total{pod="e0"} 0.0' in page  # exported before any cut
        with caplog.at_level(logging.WARNING, logger="gateway.control.reaper"):
            gw.write_pods([pod_entry(gw.engines[1])])  # e0 leaves discovery
            cut = await asyncio.wait_for(asyncio.gather(*streams), 30)
        page = (await client.get("/metrics")).text
    assert cut == [True] * live
    assert f'kvgate_dead_pod_cuts_total{{pod="e0"}} {float(live)}' in page
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.control.reaper"]
    assert len(lines) == 1 and f"cut its {live} request(s) in flight" in lines[0], lines
