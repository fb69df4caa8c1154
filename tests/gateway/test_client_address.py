"""The client address: forwarding headers believed only from a trusted proxy
(`KVGATE_TRUSTED_PROXIES`), the right-most address that is not a trusted proxy; the same
address for the per-client body limit and the per-client prompt sizes."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.errors import ConfigError
from gateway.http.client_address import TrustedProxies
from gateway.routing.prompt_size import PRIOR_BYTES_PER_TOKEN
from gateway.settings import Settings
from tests.gateway.conftest import MODEL, StartGateway
from tests.helpers import eventually
from tests.reliability.test_limits import (
    chat_body,
    limiter_of,
    open_partial_request,
    read_response,
)

Headers = list[tuple[bytes, bytes]]


def xff(*values: str) -> Headers:
    return [(b"x-forwarded-for", value.encode()) for value in values]


@pytest.mark.parametrize(
    ("headers", "client"),
    [
        ([], "10.0.0.2"),  # nothing forwarded: the proxy itself
        (xff("203.0.113.7"), "203.0.113.7"),
        (xff("198.51.100.1, 203.0.113.7"), "203.0.113.7"),  # the client's own claim, left
        (xff("203.0.113.7, 10.0.0.5"), "203.0.113.7"),  # a second trusted hop
        (xff("10.0.0.9, 10.0.0.5"), "10.0.0.9"),  # every hop trusted: the left-most
        (xff("198.51.100.1", "203.0.113.7"), "203.0.113.7"),  # two header lines, in order
        (xff("203.0.113.7:5555"), "203.0.113.7"),
        (xff("[2001:db8::7]:443"), "2001:db8::7"),
        (xff("2001:db8::7"), "2001:db8::7"),
        (xff("::ffff:203.0.113.7"), "203.0.113.7"),
        (xff("unknown"), "10.0.0.2"),  # no address: the nearest trusted hop
        (xff("203.0.113.7, unknown, 10.0.0.5"), "10.0.0.5"),
        (xff("not an address"), "10.0.0.2"),
        (
            [(b"forwarded", b'for=198.51.100.1, for="[2001:db8::7]:4711";proto=https')],
            "2001:db8::7",
        ),
        ([(b"forwarded", b"For=203.0.113.7;by=10.0.0.2")], "203.0.113.7"),
        ([(b"forwarded", b"for=unknown")], "10.0.0.2"),
        # X-Forwarded-For, what proxies set, is read before Forwarded
        ([(b"forwarded", b"for=198.51.100.1"), *xff("203.0.113.7")], "203.0.113.7"),
    ],
)
def test_the_client_is_the_right_most_address_not_a_trusted_proxy(
    headers: Headers, client: str
) -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    assert proxies.client("10.0.0.2", headers) == client


def test_only_a_trusted_peer_is_a_proxy() -> None:
    proxies = TrustedProxies(["10.0.0.0/8", "2001:db8:1::/48", "127.0.0.1/32"])
    for peer in ("10.1.2.3", "2001:db8:1::9", "127.0.0.1", "::ffff:127.0.0.1"):
        assert proxies.trusts_peer(peer), peer
    for peer in ("11.0.0.1", "2001:db8:2::1", "127.0.0.2", "", "not an address"):
        assert not proxies.trusts_peer(peer), peer
    assert not TrustedProxies([])


def test_the_setting_takes_addresses_and_ranges() -> None:
    loaded = Settings.load({"KVGATE_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.1.7 ,fd00::/8"})
    assert loaded.trusted_proxies == ("10.0.0.0/8", "192.168.1.7/32", "fd00::/8")
    assert Settings.load({}).trusted_proxies == ()
    for bad in ("10.0.0.0/33", "proxy.local", "10.0.0.1;10.0.0.2"):
        with pytest.raises(ConfigError, match="KVGATE_TRUSTED_PROXIES"):
            Settings.load({"KVGATE_TRUSTED_PROXIES": bad})


async def test_forwarding_headers_from_an_untrusted_peer_change_nothing(
    start_gateway: StartGateway,
) -> None:
    """No proxy trusted (the default, and uvicorn's own trust of 127.0.0.1 is off): bodies
    trickled from one address under a different forwarded address each still count
    against that one address, and the third is refused."""
    gw = await start_gateway(engines=1, max_bodies_per_client=2, body_timeout_s=30.0)
    limiter = limiter_of(gw)
    body = chat_body()
    opened = []
    try:
        for index in range(2):
            spoofed = {"x-forwarded-for": f"203.0.113.{index}",
                       "forwarded": f"for=203.0.113.{index}"}  # fmt: skip
            opened.append(await open_partial_request(
                gw.server.port, "/v1/chat/completions", body, sent=5, headers=spoofed
            ))  # fmt: skip
        await eventually(lambda: limiter.slow == {"127.0.0.1": 2}, what="2 slow bodies")
        reader, writer = await open_partial_request(
            gw.server.port, "/v1/chat/completions", body, sent=5,
            headers={"x-forwarded-for": "203.0.113.99"},
        )  # fmt: skip
        opened.append((reader, writer))
        status, _, _ = await read_response(reader)
        assert status == 429
    finally:
        for _, writer in opened:
            writer.close()


async def test_a_trusted_proxy_s_clients_are_told_apart(start_gateway: StartGateway) -> None:
    """127.0.0.1 is the trusted proxy: each forwarded client has its own body limit, and
    its prompt sizes are learned under its own address."""
    gw = await start_gateway(engines=1, max_bodies_per_client=2, body_timeout_s=30.0,
                             trusted_proxies=("127.0.0.1/32",),
                             default_policy="round-robin")  # fmt: skip
    limiter = limiter_of(gw)
    body = chat_body()
    port = gw.server.port
    path = "/v1/chat/completions"
    # the client claims an address of its own; the proxy appends the one it saw
    alice = {"x-forwarded-for": "198.51.100.1, 203.0.113.7"}
    bob = {"x-forwarded-for": "203.0.113.8"}
    opened = []
    try:
        for headers in (alice, alice, bob):
            opened.append(await open_partial_request(port, path, body, 5, headers=headers))
        await eventually(
            lambda: limiter.slow == {"203.0.113.7": 2, "203.0.113.8": 1}, what="slow bodies"
        )
        reader, writer = await open_partial_request(port, path, body, 5, headers=alice)
        opened.append((reader, writer))
        status, _, _ = await read_response(reader)
        assert status == 429  # alice's third
        reader, writer = await open_partial_request(port, path, body, 5, headers=bob)
        opened.append((reader, writer))
        await eventually(lambda: limiter.slow.get("203.0.113.8") == 2, what="bob's second")
        assert not reader.at_eof()
    finally:
        for _, writer in opened:
            writer.close()
    sizes = gw.state.router.prompt_sizes
    chat = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi " * 200}]}
    whole = json.dumps(chat).encode()
    async with gw.client(headers={"x-forwarded-for": "203.0.113.9"}) as client:
        answers = await asyncio.gather(
            *(client.post(path, content=whole) for _ in range(3))
        )  # fmt: skip
    assert [answer.status_code for answer in answers] == [200] * 3
    assert sizes.bytes_per_token(MODEL, "addr:203.0.113.9") != PRIOR_BYTES_PER_TOKEN
    assert sizes.bytes_per_token(MODEL, "addr:127.0.0.1") == PRIOR_BYTES_PER_TOKEN
