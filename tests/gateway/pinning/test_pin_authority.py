"""Pinning changes server state: only an authorised caller may pin, leases only follow an
engine's 2xx, and they are bounded in number and lifetime."""

from __future__ import annotations

import asyncio

import httpx

from tests.gateway.conftest import ADMIN_TOKEN, MODEL, StartGateway
from tests.gateway.pinning.test_pinning import CONVERSATION, SGLANG, admin, warm
from tests.helpers import eventually

PIN = {"x-kvgate-pin": "ttl=60", "x-session-id": "vip"}


async def post(gw: object, headers: dict[str, str], **extra: object) -> httpx.Response:
    async with gw.client() as client:  # type: ignore[attr-defined]
        return await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": CONVERSATION, "max_tokens": 2} | extra,
            headers=headers,
        )


def forbidden(page: str) -> float:
    prefix = 'kvgate_requests_rejected_total{reason="PinForbidden"} '
    return sum(float(line.split()[-1]) for line in page.splitlines() if line.startswith(prefix))


async def test_anonymous_pins_are_refused_and_nothing_is_pinned(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_token="app-pin-token")
    for credential in (None, "wrong", "app-pin-token-but-longer"):
        headers = dict(PIN) if credential is None else {**PIN, "x-kvgate-pin-token": credential}
        response = await post(gw, headers)
        assert response.status_code == 403, response.text
        error = response.json()["error"]
        assert error["type"] == "permission_error" and error["param"] == "x-kvgate-pin-token"
    assert gw.engines[0].engine.scheduler.stats.finished == 0  # refused before any engine
    # Neither the pin token's holder nor the admin goes through /v1 with the bearer header.
    bearer = await post(gw, {**PIN, "authorization": f"Bearer {ADMIN_TOKEN}"})
    assert bearer.status_code == 403
    async with gw.client() as client:
        page = (await client.get("/metrics")).text
    assert forbidden(page) == 4
    assert gw.state.pins.leases() == []


async def test_no_token_configured_means_no_pinning(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, admin_token=None)
    response = await post(gw, {**PIN, "x-kvgate-pin-token": ""})
    assert response.status_code == 403
    assert "none is configured" in response.json()["error"]["message"]


async def test_the_pin_token_or_the_admin_token_pins(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_token="app-pin-token")
    for session, token in (("a", "app-pin-token"), ("b", ADMIN_TOKEN)):
        headers = {**PIN, "x-session-id": session, "x-kvgate-pin-token": token}
        chat = [{"role": "user", "content": f"conversation {session}: " + "tell me more. " * 40}]
        assert (await post(gw, headers, messages=chat)).status_code == 200
    await eventually(lambda: len(gw.state.pins.leases()) == 2, what="two session leases")
    assert {lease.session for lease in gw.state.pins.leases()} == {"a", "b"}


async def test_an_engine_refusal_creates_no_lease(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG)
    headers = {**PIN, "x-kvgate-pin-token": ADMIN_TOKEN}
    refused = await post(gw, headers, max_tokens=10**9)  # the engine answers 400
    assert refused.status_code == 400
    await asyncio.sleep(0)  # a lease would be scheduled right away; none may be
    assert gw.state.pins.leases() == []


async def test_leases_are_capped_and_their_ttl_bounded(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_max_leases_per_pod=1,
                             pin_max_ttl_s=120.0, pin_default_ttl_s=60.0)  # fmt: skip
    await warm(gw)
    too_long = await post(gw, {**PIN, "x-kvgate-pin": "ttl=86400",
                               "x-kvgate-pin-token": ADMIN_TOKEN})  # fmt: skip
    assert too_long.status_code == 400 and "KVGATE_PIN_MAX_TTL" in too_long.text
    first = await admin(gw, "POST", "/admin/pin",
                        {"model": MODEL, "messages": CONVERSATION, "ttl_s": 60})  # fmt: skip
    assert first.status_code == 200, first.text
    second = await admin(gw, "POST", "/admin/pin",
                         {"model": MODEL, "messages": CONVERSATION[:1], "ttl_s": 60})  # fmt: skip
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "lease_cap"
    assert len(gw.state.pins.leases()) == 1


async def test_a_pending_lease_is_resolved_again_only_when_the_index_changed(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(1, engine_overrides=SGLANG, pin_interval_s=30.0)  # by hand
    pins, table = gw.state.pins, gw.state.table
    await warm(gw)
    answer = await admin(gw, "POST", "/admin/pin", {"model": MODEL, "messages": CONVERSATION})
    assert answer.status_code == 200, answer.text
    (lease,) = pins.leases()
    assert lease.tokens.itemsize == 4  # type: ignore[attr-defined]  # packed, not a list

    async def reconcile_as_pending() -> None:
        lease.complete = False  # as a lease whose prompt is not all stored yet
        await pins.reconcile()

    await reconcile_as_pending()
    checked = lease.checked_at
    assert checked == table.pod_generation("e0")
    await reconcile_as_pending()
    await reconcile_as_pending()
    assert lease.checked_at == checked  # nothing changed: not resolved again
    assert lease.complete is False
    other = [{"role": "user", "content": "something else entirely " * 10}]
    async with gw.client() as client:  # new blocks on the pod: resolved at the next round
        await client.post(
            "/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": other}
        )
    await eventually(lambda: table.pod_generation("e0") != checked, what="index changed")
    await reconcile_as_pending()
    assert lease.checked_at is not None and lease.checked_at != checked
    assert lease.complete is True  # resolved again: its blocks are all held
