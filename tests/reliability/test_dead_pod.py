"""A pod that is gone does not hold its clients until the upstream timeout: after the
grace period its in-flight streams are cut (so clients can retry), counted and logged."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from simulator import LatencyModel
from tests.gateway.conftest import MODEL, StartGateway, pod_entry

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
        is None
    )
