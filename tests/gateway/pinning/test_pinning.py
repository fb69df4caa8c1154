"""Pinning end to end: a real gateway in front of real `--flavor sglang` simulated engines
with small caches, floods of other traffic sent straight to the engine."""

from __future__ import annotations

import random
from collections.abc import Awaitable
from typing import Any

import httpx

from simulator import EngineServer
from tests.gateway.conftest import ADMIN_TOKEN, MODEL, Gateway, StartGateway, pod_entry
from tests.helpers import eventually

PIN_AUTH = {"x-kvgate-pin-token": ADMIN_TOKEN}

SGLANG = {"flavor": "sglang", "gpu_blocks": 64}
SYSTEM = " ".join(f"rule {i}: answer briefly and cite section {i * 7}." for i in range(24))


def messages(*turns: str) -> list[dict[str, str]]:
    chat = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        chat.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return chat


CONVERSATION = messages("What is rule 3 about?")


async def chat(gw: Gateway, chat_messages: list[dict[str, str]], **headers: str) -> httpx.Response:
    async with gw.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": chat_messages, "max_tokens": 4},
            headers=headers,
        )
    assert response.status_code == 200, response.text
    return response


async def admin(gw: Gateway, method: str, path: str, body: Any = None) -> httpx.Response:
    async with gw.admin() as client:
        return await client.request(method, path, json=body)


async def pin(gw: Gateway, **extra: Any) -> dict[str, Any]:
    response = await admin(gw, "POST", "/admin/pin",
                           {"model": MODEL, "messages": CONVERSATION, **extra})  # fmt: skip
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def flood(engine: EngineServer, requests: int = 12, tokens: int = 300) -> None:
    """Other traffic, straight to the engine: unique prompts that cycle its cache."""
    rng = random.Random()
    async with httpx.AsyncClient(base_url=engine.url, timeout=30) as client:
        for _ in range(requests):
            prompt = [rng.randrange(300, 2600) for _ in range(tokens)]
            response = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2}
            )
            assert response.status_code == 200, response.text


async def resident(engine: EngineServer) -> set[Any]:
    async with httpx.AsyncClient(base_url=engine.url, timeout=10) as client:
        tiers = (await client.get("/sim/cache")).json()["tiers"]
    return {h for hashes in tiers.values() for h in hashes}


async def engine_pins(engine: EngineServer) -> int:
    async with httpx.AsyncClient(base_url=engine.url, timeout=10) as client:
        count: int = (await client.get("/sim/stats")).json()["cache"]["pinned_blocks"]
    return count


def held(gw: Gateway, lease_id: str) -> list[Any]:
    lease = gw.state.pins.book.get(lease_id)
    return list(lease.held) if lease is not None else []


async def metric(gw: Gateway, name: str) -> float:
    async with gw.client() as client:
        text = (await client.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def matched_share(gw: Gateway, pod: str = "e0") -> float:
    """Of the conversation's prompt blocks, the share the index says `pod` holds."""
    async with gw.admin() as client:
        body = {"model": MODEL, "messages": CONVERSATION}
        answer = (await client.post("/admin/match", json=body)).json()
    held: int = answer["pods"][pod]["matched_blocks"]
    return held / answer["prompt_blocks"]


async def warm(gw: Gateway) -> None:
    """Serve the conversation once and wait until the index holds its blocks."""
    await chat(gw, CONVERSATION)

    async def indexed() -> bool:
        async with gw.admin() as client:
            body = {"model": MODEL, "messages": CONVERSATION}
            answer = (await client.post("/admin/match", json=body)).json()
        return any(p["tiers"].get("GPU", 0) >= 10 for p in answer["pods"].values())

    await eventually(indexed, what="the conversation's blocks indexed")


async def test_pin_survives_flood_and_follow_up_is_cached(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_interval_s=0.2)
    engine = gw.engines[0]
    await warm(gw)
    lease = await pin(gw, ttl_s=60)
    assert lease["state"] == "pinned" and lease["pod"] == "e0" and lease["blocks"] >= 10
    hashes = held(gw, lease["id"])
    assert await engine_pins(engine) == len(hashes)
    await flood(engine)
    assert set(hashes) <= await resident(engine)
    # an SGLang-only fleet: the chat was tokenized in-process, and stays matched
    assert gw.state.settings.tokenizer_endpoint is None
    await eventually(lambda: _at_least(matched_share(gw), 0.9), what="pinned blocks matched")
    follow_up = await chat(gw, [*CONVERSATION, {"role": "assistant", "content": "ok"}])
    assert int(follow_up.headers["x-kvgate-cached-blocks"]) >= len(hashes)
    cached = follow_up.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16 * len(hashes)
    listed = (await admin(gw, "GET", "/admin/pins")).json()
    assert [p["id"] for p in listed["pins"]] == [lease["id"]]
    assert listed["pods"]["e0"]["pinned_blocks"] == len(hashes)
    assert await metric(gw, "kvgate_pinned_blocks") == len(hashes)
    assert await metric(gw, "kvgate_pins_active") == 1


async def test_unpinned_prefix_is_evicted_by_the_flood(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_interval_s=0.2)
    engine = gw.engines[0]
    await warm(gw)
    lease = await pin(gw)
    hashes = held(gw, lease["id"])
    answer = await admin(gw, "POST", "/admin/unpin", {"id": lease["id"]})
    assert answer.status_code == 200 and answer.json()["blocks"] == len(hashes)
    assert await engine_pins(engine) == 0
    await flood(engine)
    assert not set(hashes) & await resident(engine)
    await eventually(lambda: _below(matched_share(gw), 0.9), what="evicted blocks unmatched")
    assert (await admin(gw, "POST", "/admin/unpin", {"id": lease["id"]})).status_code == 404


async def test_double_pin_needs_double_unpin(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_interval_s=0.2)
    engine = gw.engines[0]
    await warm(gw)
    first, second = await pin(gw), await pin(gw)
    hashes = held(gw, first["id"])
    assert hashes == held(gw, second["id"])
    await admin(gw, "POST", "/admin/unpin", {"id": first["id"]})
    await flood(engine)
    assert set(hashes) <= await resident(engine)  # still pinned once
    await admin(gw, "POST", "/admin/unpin", {"id": second["id"]})
    await flood(engine)
    assert not set(hashes) & await resident(engine)
    await eventually(lambda: _below(matched_share(gw), 0.9), what="evicted blocks unmatched")


async def test_lease_expires(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_interval_s=0.1)
    engine = gw.engines[0]
    await warm(gw)
    await pin(gw, ttl_s=0.5)
    assert await engine_pins(engine) > 0

    async def expired() -> bool:
        return await engine_pins(engine) == 0 and not gw.state.pins.leases()

    await eventually(expired, what="the lease expired and unpinned")
    assert await metric(gw, "kvgate_pin_lease_expiries_total") == 1


async def test_engine_restart_is_repinned(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_interval_s=0.1)
    engine = gw.engines[0]
    await warm(gw)
    lease = await pin(gw, ttl_s=60)
    hashes = held(gw, lease["id"])
    async with httpx.AsyncClient(base_url=engine.url) as client:
        wipe = {"restart_publisher": True, "wipe_cache": True}
        assert (await client.post("/sim/faults", json=wipe)).status_code == 200
    assert await engine_pins(engine) == 0
    await warm(gw)  # the conversation comes back: its blocks are stored again

    async def repinned() -> bool:
        return await engine_pins(engine) == len(hashes)

    await eventually(repinned, what="the lease pinned again")
    assert await metric(gw, "kvgate_repins_total") == 1
    await flood(engine)
    assert set(hashes) <= await resident(engine)
    # A restart that kept the cache (and, in the simulator, its pins): counts stay equal.
    async with httpx.AsyncClient(base_url=engine.url) as client:
        await client.post("/sim/faults", json={"restart_publisher": True})

    async def repinned_again() -> bool:
        return await metric(gw, "kvgate_repins_total") == 2

    await eventually(repinned_again, what="the lease re-pinned after the second restart")
    assert await engine_pins(engine) == len(hashes)
    await admin(gw, "POST", "/admin/unpin", {"id": lease["id"]})
    assert await engine_pins(engine) == 0  # the re-pin did not double the engine's counts


async def test_budget_refusal(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_budget_fraction=0.1)
    await warm(gw)
    answer = await admin(gw, "POST", "/admin/pin", {"model": MODEL, "messages": CONVERSATION})
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "budget" and "budget of 6 blocks" in error["message"]
    assert await engine_pins(gw.engines[0]) == 0
    assert await metric(gw, 'kvgate_pin_refusals_total{reason="budget"}') == 1


async def test_engine_without_pin_support(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides={"gpu_blocks": 64})  # vLLM flavour
    await warm(gw)
    answer = await admin(gw, "POST", "/admin/pin", {"model": MODEL, "messages": CONVERSATION})
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "no_pin_support" and "no pin support" in error["message"]
    # The request-level opt-in still serves, and keeps a pin-less lease for the session.
    await chat(gw, CONVERSATION, **{"x-kvgate-pin": "ttl=60", "x-session-id": "vip", **PIN_AUTH})
    await eventually(lambda: bool(gw.state.pins.leases()), what="a session lease")
    assert gw.state.pins.leases()[0].state == "no_pin_support"
    views = (await admin(gw, "GET", "/admin/pins")).json()["pods"]
    assert views["e0"]["pin_support"] is False


async def test_gateway_shutdown_unpins(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG)
    await warm(gw)
    await pin(gw)
    assert await engine_pins(gw.engines[0]) > 0
    await gw.server.stop()
    assert await engine_pins(gw.engines[0]) == 0


async def test_session_header_pins_and_keeps_the_conversation(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(2, engine_overrides=SGLANG, pin_interval_s=0.2)
    headers = {"x-kvgate-pin": "ttl=60", "x-session-id": "vip", **PIN_AUTH}
    first = await chat(gw, CONVERSATION, **headers)
    pod = first.headers["x-kvgate-pod"]
    engine = next(e for e in gw.engines if e.engine.config.name == pod)

    def pinned_blocks() -> int:
        leases = gw.state.pins.leases()
        return len(leases[0].held) if leases else 0

    await eventually(lambda: pinned_blocks() >= 10, what="the first turn pinned")
    before = pinned_blocks()
    turn2 = [*CONVERSATION, {"role": "assistant", "content": "It is about brevity."},
             {"role": "user", "content": "And rule 4, in some more detail please?"}]  # fmt: skip
    second = await chat(gw, turn2, **headers)
    assert second.headers["x-kvgate-pod"] == pod
    await eventually(lambda: pinned_blocks() > before, what="the lease extended to turn 2")
    assert len(gw.state.pins.leases()) == 1
    assert await engine_pins(engine) == pinned_blocks()
    await flood(engine)
    third = await chat(gw, [*turn2, {"role": "assistant", "content": "Sure."}], **headers)
    assert third.headers["x-kvgate-pod"] == pod
    assert int(third.headers["x-kvgate-cached-blocks"]) >= pinned_blocks()


async def test_per_token_engine_blocks(start_gateway: StartGateway) -> None:
    """SGLang with page size 1: one engine block per token, pinned through re-chunking."""
    gw = await start_gateway(1, engine_overrides={**SGLANG, "block_size": 1, "gpu_blocks": 1024})
    engine = gw.engines[0]
    await warm(gw)
    lease = await pin(gw)
    hashes = held(gw, lease["id"])
    assert lease["blocks"] == len(hashes) >= 160  # every token of the stored prompt
    await flood(engine, requests=10, tokens=300)
    assert set(hashes) <= await resident(engine)


async def test_pinned_blocks_moved_to_host_stay_held(start_gateway: StartGateway) -> None:
    """With a host tier a pinned block may leave the GPU, never the host: still pinned, now
    counted in the CPU tier, and no re-pin (nothing was lost)."""
    gw = await start_gateway(1, engine_overrides={**SGLANG, "host_blocks": 512},
                             pin_interval_s=0.1)  # fmt: skip
    engine = gw.engines[0]
    await warm(gw)
    lease = await pin(gw)
    hashes = held(gw, lease["id"])
    await flood(engine, requests=16)

    async def on_host() -> bool:
        listed = (await admin(gw, "GET", "/admin/pins")).json()["pins"]
        return bool(listed) and listed[0]["tiers"].get("CPU", 0) > 0

    await eventually(on_host, what="pinned blocks reported on the host tier")
    assert held(gw, lease["id"]) == hashes
    assert await engine_pins(engine) == len(hashes)
    assert await metric(gw, "kvgate_repins_total") == 0
    follow_up = await chat(gw, [*CONVERSATION, {"role": "assistant", "content": "ok"}])
    cached = follow_up.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16 * len(hashes)


async def test_pod_without_kv_events_is_refused(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG)
    gw.write_pods([pod_entry(gw.engines[0], events=False)])
    await eventually(lambda: gw.state.registry.index_mode("e0") == "approximate",
                     what="the pod reloaded without events")  # fmt: skip
    answer = await admin(gw, "POST", "/admin/pin", {"model": MODEL, "messages": CONVERSATION})
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "no_kv_events"


async def _at_least(share: Awaitable[float], bound: float) -> bool:
    return await share >= bound


async def _below(share: Awaitable[float], bound: float) -> bool:
    return await share < bound


async def test_a_prompt_the_engine_refuses_is_a_400_not_an_upstream_error(
    start_gateway: StartGateway,
) -> None:
    """Pinning tokenizes the prompt and sends it nowhere else: when the tokenizer refuses
    it (a message whose content is `false`, as vLLM refuses it), the client hears why, as
    a 400, not a 502 for an engine that answered."""
    gw = await start_gateway(1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": False}]}
    answer = await admin(gw, "POST", "/admin/pin", body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "messages" and "refused" in error["message"]
