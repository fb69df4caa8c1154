"""Bad HTTP input against a real gateway: hypothesis-generated bodies and headers.

Every answer the gateway gives itself is a 4xx with OpenAI's error body, never a 5xx; a
body the gateway refuses never reaches an engine (neither /v1 nor /tokenize). Hypothesis
runs in a worker thread with a blocking client while the gateway serves on the test's
event loop.
"""

from __future__ import annotations

import asyncio
import json
import socket
import string
from collections.abc import Callable
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import ADMIN_TOKEN, MODEL, Gateway, StartGateway

EXAMPLES = 150
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_BODY = 64 * 1024

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
not_a_model = json_values.filter(lambda v: not (isinstance(v, str) and v))
not_messages = json_values.filter(
    lambda v: not (isinstance(v, list) and v and all(isinstance(m, dict) for m in v))
)
not_a_prompt = json_values.filter(lambda v: not (isinstance(v, str | list) and v != []))


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode()


def _nested(depth: int, opener: str) -> bytes:
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "[":
        return ("[" * depth + "]" * depth).encode()
    return ('{"a":' * depth + "1" + closer * depth).encode()


huge_numbers = st.sampled_from(
    [b"1" * 5000, b"1e999999", b"-1e999999", b"123456789" * 600, b'{"model": 1e400}']
)
deep = st.builds(_nested, st.integers(min_value=500, max_value=200_000), st.sampled_from("[{"))
invalid_utf8 = st.binary(min_size=1, max_size=64).map(
    lambda junk: b'{"model": "' + b"\xff\xfe\xc3" + junk + b'", "prompt": "x"}'
)

# Bodies the gateway must refuse itself, whatever the endpoint.
invalid_bodies = st.one_of(
    st.binary(max_size=512),
    json_values.filter(lambda v: not isinstance(v, dict)).map(_dump),
    huge_numbers,
    deep,
    invalid_utf8,
    st.builds(lambda m: _dump({"model": m, "messages": [{"role": "user"}]}), not_a_model),
    st.builds(lambda m: _dump({"model": MODEL, "messages": m}), not_messages),
    st.builds(lambda p: _dump({"model": MODEL, "prompt": p}), not_a_prompt),
    st.builds(lambda s: _dump({"model": MODEL, "prompt": "x", "stream": s}), json_values).filter(
        lambda raw: not isinstance(json.loads(raw)["stream"], bool)
    ),
    st.builds(
        lambda m: _dump({"model": m, "prompt": "x", "messages": [{}]}),
        st.text(min_size=1, max_size=40).filter(lambda m: m != MODEL),
    ),  # a model nobody serves: 404
    st.sampled_from(
        [b"x" * (MAX_BODY + 1), _dump({"model": MODEL, "prompt": "y" * MAX_BODY})]
    ),  # over the body limit: 413
)

header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"),
    max_size=200,
)
header_names = st.text(alphabet=string.ascii_letters + string.digits + "-", min_size=1, max_size=30)
fuzzed_headers = st.dictionaries(
    st.sampled_from(
        ["x-kvgate-policy", "routing-strategy", "x-session-id", "authorization", "host",
         "content-type", "x-kvgate-pod", "x-request-id", "accept", "transfer-encoding-x"]
    ) | header_names,
    header_text,
    max_size=6,
)  # fmt: skip


def raw_headers(headers: dict[str, str]) -> dict[str, bytes]:
    """As bytes: a header may carry any latin-1 byte (httpx refuses them in a str), without
    the surrounding blanks the client itself refuses."""
    return {name: value.strip(" \t").encode("latin-1") for name, value in headers.items()}


def assert_openai_error(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def upstream_counters(gw: Gateway) -> dict[str, float]:
    """What reached the engines: requests they scheduled, tokenizer calls the gateway made,
    requests it proxied."""
    registry = gw.state.metrics.prometheus
    counters = {
        "scheduled": sum(
            s.engine.scheduler.stats.finished
            + s.engine.scheduler.stats.aborted
            + len(s.engine.scheduler.running)
            + len(s.engine.scheduler.waiting)
            for s in gw.engines
        ),
        "tokenizer_calls": sum(
            registry.get_sample_value("kvgate_tokenizer_requests_total", {"outcome": o}) or 0.0
            for o in ("miss", "failure")
        ),
    }
    proxied = 0.0
    for metric in registry.collect():
        if metric.name == "kvgate_requests":
            proxied += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    counters["proxied"] = proxied
    return counters


async def run_in_thread(check: Callable[[], None]) -> None:
    await asyncio.to_thread(check)


async def test_invalid_bodies_get_4xx_openai_errors_and_reach_no_engine(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(1, max_body_bytes=MAX_BODY)
    before = upstream_counters(gw)
    statuses: list[int] = []

    def fuzz() -> None:
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}

            @FUZZ_SETTINGS
            @given(
                body=invalid_bodies,
                path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/admin/match"]),
                headers=fuzzed_headers,
            )
            def check(body: bytes, path: str, headers: dict[str, str]) -> None:
                sent = {k: v for k, v in headers.items() if k not in ("host", "authorization")}
                if path.startswith("/admin"):
                    sent.update(admin)
                response = client.post(path, content=body, headers=raw_headers(sent))
                statuses.append(response.status_code)
                assert_openai_error(response)
                assert "x-kvgate-pod" not in response.headers

            check()

    await run_in_thread(fuzz)
    assert len(statuses) >= EXAMPLES // 2
    assert upstream_counters(gw) == before


async def test_fuzzed_headers_and_near_valid_bodies_never_get_a_gateway_5xx(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(1, max_body_bytes=MAX_BODY)
    proxied: list[int] = []

    near_valid = st.fixed_dictionaries(
        {"model": st.just(MODEL), "max_tokens": st.integers(1, 3)},
        optional={
            "messages": st.lists(
                st.dictionaries(st.sampled_from(["role", "content", "name"]), json_values),
                min_size=1,
                max_size=3,
            ),
            "prompt": st.text(max_size=50) | st.lists(st.integers(-5, 2**40), min_size=1),
            "temperature": json_values,
            "n": json_values,
        },
    )

    def fuzz() -> None:
        with httpx.Client(base_url=gw.url, timeout=30) as client:

            @FUZZ_SETTINGS
            @given(
                body=near_valid,
                chat=st.booleans(),
                headers=fuzzed_headers,
                admin_path=st.sampled_from(
                    [
                        "/admin/pods",
                        "/admin/index?pod=e0",
                        "/admin/index",
                        "/admin/index?pod=%00%ff",
                        "/admin/index?pod=http://x",
                        "/admin/snapshot?pod=e0",
                    ]
                ),
            )
            def check(
                body: dict[str, Any], chat: bool, headers: dict[str, str], admin_path: str
            ) -> None:
                path = "/v1/chat/completions" if chat else "/v1/completions"
                response = client.post(path, json=body, headers=raw_headers(headers))
                if "x-kvgate-pod" in response.headers:
                    # the engine's own answer (it validates the rest of the body itself)
                    proxied.append(response.status_code)
                    assert response.status_code < 500, response.text[:300]
                else:
                    assert_openai_error(response)
                # admin with fuzzed credentials (headers may carry any latin-1 byte)
                response = client.get(admin_path, headers=raw_headers(headers))
                if response.status_code != 200:
                    assert_openai_error(response)
                    if headers.get("authorization") != f"Bearer {ADMIN_TOKEN}":
                        assert response.status_code == 401

            check()

    await run_in_thread(fuzz)
    assert proxied, "no near-valid body reached an engine: the strategy is too narrow"


VALID_REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b'content-length: 47\r\n\r\n{"model": "sim-model", "prompt": "hi", "n": 1}\n'
)
BROKEN_FRAMING = [
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-a: \x00\x01\r\ncontent-length: 2\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: -5\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n"
    b"transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n",
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999999999999\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"P" * 5000 + b" / HTTP/1.1\r\n\r\n",
    b"GET /v1/models HTTP/9.9\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on plain HTTP
]


def exchange(port: int, raw: bytes) -> bytes:
    """Send `raw`, half-close, return whatever the server answers before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def assert_no_server_error(answer: bytes) -> None:
    """Closed without an answer, or an HTTP status below 500."""
    if answer:
        assert answer.startswith(b"HTTP/1.1 "), answer[:80]
        assert int(answer.split()[1]) < 500, answer[:300]


async def test_broken_http_framing_never_gets_a_5xx(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1)
    port = gw.server.port

    def fuzz() -> None:
        for raw in BROKEN_FRAMING:
            assert_no_server_error(exchange(port, raw))

        @FUZZ_SETTINGS
        @given(
            edits=st.lists(
                st.tuples(st.integers(0, len(VALID_REQUEST) - 1), st.integers(0, 255)),
                min_size=1,
                max_size=6,
            ),
            cut=st.integers(1, len(VALID_REQUEST)),
        )
        def check(edits: list[tuple[int, int]], cut: int) -> None:
            raw = bytearray(VALID_REQUEST)
            for at, byte in edits:
                raw[at] = byte
            assert_no_server_error(exchange(port, bytes(raw[:cut])))

        check()

    await run_in_thread(fuzz)
    async with gw.client() as client:
        assert (await client.get("/health")).status_code == 200


surrogate_text = st.text(
    alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(),
    max_size=12,
)
token_ids = st.lists(
    st.integers(-3, 2**33) | st.booleans() | st.floats(allow_nan=False), min_size=1, max_size=8
)
any_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.just(MODEL) | json_values,
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system"])},
                optional={"content": surrogate_text | json_values},
            ),
            max_size=3,
        ),
        "prompt": surrogate_text | token_ids | st.lists(token_ids, max_size=2) | json_values,
        "max_tokens": st.integers(-2, 4) | json_values,
        "stream": st.booleans() | json_values,
        "ttl_s": st.floats(allow_nan=False) | json_values,
        "pod": st.just("e0") | json_values,
        "lease_id": st.text(max_size=10) | json_values,
    },
).map(lambda body: json.dumps(body).encode())  # ensure_ascii: lone surrogates as \\udXXX
state_headers = st.fixed_dictionaries(
    {},
    optional={
        "x-kvgate-pin": st.sampled_from(["ttl=60", "on", "ttl=-1", "ttl=1e9", "x"]) | header_text,
        "x-kvgate-pin-token": st.sampled_from([ADMIN_TOKEN, "", "nope"]) | header_text,
        "x-slo-ttft-ms": st.sampled_from(["0.001", "100000", "-1", "nan", "inf"]) | header_text,
        "x-kvgate-policy": st.sampled_from(["prefix-cache", "prefix-share", "session"])
        | header_text,
        "x-session-id": header_text,
    },
)
ENDPOINTS = [
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
    ("GET", "/health"), ("GET", "/ready"), ("GET", "/metrics"), ("GET", "/admin/pods"),
    ("GET", "/admin/index?pod=e0"), ("GET", "/admin/snapshot?pod=e0"),
    ("POST", "/admin/match"), ("POST", "/admin/pin"), ("POST", "/admin/unpin"),
    ("GET", "/admin/pins"),
    ("POST", "/v1/embeddings"), ("POST", "/v1/responses"), ("POST", "/tokenize"),
    ("POST", "/score"), ("GET", "/v1/models/sim-model"),
]  # fmt: skip


async def test_every_endpoint_with_generated_bodies_and_headers_never_gets_a_gateway_5xx(
    start_gateway: StartGateway,
) -> None:
    """Every route, with and without the admin token, with bodies that may carry lone
    surrogates, booleans and out-of-range numbers as token ids, and the state-changing
    headers (pin, SLO, policy): no answer of the gateway's own is a 5xx."""
    gw = await start_gateway(1, max_body_bytes=MAX_BODY, engine_overrides={"flavor": "sglang"})
    seen: set[int] = set()

    def fuzz() -> None:
        with httpx.Client(base_url=gw.url, timeout=30) as client:

            @FUZZ_SETTINGS
            @given(
                endpoint=st.sampled_from(ENDPOINTS),
                body=any_body,
                headers=state_headers,
                admin=st.booleans(),
            )
            def check(
                endpoint: tuple[str, str], body: bytes, headers: dict[str, str], admin: bool
            ) -> None:
                method, path = endpoint
                sent = raw_headers(headers)
                if admin:
                    sent["authorization"] = f"Bearer {ADMIN_TOKEN}".encode()
                content = body if method == "POST" else None
                response = client.request(method, path, content=content, headers=sent)
                seen.add(response.status_code)
                if "x-kvgate-pod" in response.headers:
                    return  # the engine's own answer (it validates the rest itself)
                assert response.status_code < 500, (endpoint, body[:200], response.text[:300])
                if response.status_code >= 400:
                    assert_openai_error(response)

            check()

    await run_in_thread(fuzz)
    assert {200, 400} <= seen  # the strategy reaches both
