"""Client input the gateway cannot use is a 400 with an OpenAI-style body and a counter,
never a 5xx or a traceback: lone surrogates, booleans and out-of-range token ids."""

from __future__ import annotations

import httpx
import pytest

from simulator.cache_types import Tier
from tests.gateway.conftest import ADMIN_TOKEN, MODEL, StartGateway
from tests.reliability.test_http_fuzz import assert_openai_error

LONE_SURROGATE = b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}' % (
    MODEL.encode()
)


def rejected(page: str, reason: str) -> float:
    prefix = f'kvgate_requests_rejected_total{{reason="{reason}"}} '
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith(prefix))  # fmt: skip


async def test_a_lone_surrogate_is_a_400_everywhere(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1)
    headers = {"content-type": "application/json"}
    async with gw.admin() as client:
        for path, extra in (
            ("/v1/chat/completions", {}),
            ("/v1/chat/completions", {"x-kvgate-pin": "ttl=60", "x-kvgate-pin-token": ADMIN_TOKEN}),
            ("/admin/match", {}),
        ):
            response = await client.post(path, content=LONE_SURROGATE, headers={**headers, **extra})
            assert_openai_error(response)
            assert response.status_code == 400
            assert "surrogate" in response.json()["error"]["message"]
        paired = LONE_SURROGATE.replace(b"\\ud800", b"\\ud83d\\ude00")  # an emoji: fine
        response = await client.post("/v1/chat/completions", content=paired, headers=headers)
        assert response.status_code == 200
        page = (await client.get("/metrics")).text
    assert rejected(page, "BadRequest") >= 3


@pytest.mark.parametrize(
    "prompt",
    [[True, False, True], [1, True], [-1, 2], [2**32], [1.5, 2], [[1, 2], [True]], [[]], ["a", 1]],
)
async def test_token_ids_must_be_integers_in_range(
    start_gateway: StartGateway, prompt: list[object]
) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        response = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
        )
    assert_openai_error(response)
    assert response.json()["error"]["param"] == "prompt"
    stats = gw.engines[0].engine.scheduler.stats
    assert stats.finished == stats.aborted == 0  # nothing reached the engine


async def test_valid_token_id_prompts_still_pass(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        for prompt in ([5, 6, 7], [[5, 6, 7]], ["one two"], "three"):
            response = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
            )
            assert response.status_code == 200, (prompt, response.text)


async def test_the_simulator_takes_booleans_as_vllm_does(start_gateway: StartGateway) -> None:
    """vLLM validates the prompt with pydantic in lax mode: `true` is the token id 1. The
    simulator does the same, and stores and publishes ints, never booleans."""
    gw = await start_gateway(engines=1)
    engine = gw.engines[0]
    prompt = [True, False] * 16
    async with httpx.AsyncClient(base_url=engine.url, timeout=10) as client:
        response = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
        )
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens"] == 32
    stored = [t for block in engine.engine.cache.resident(Tier.GPU) for t in block.tokens]
    assert stored and all(type(t) is int for t in stored)


async def test_a_generation_path_asked_with_another_method_is_a_405(
    start_gateway: StartGateway,
) -> None:
    """The generation lane takes only POST; any other method still reaches starlette's
    router, whose 405 is answered in OpenAI's shape."""
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        for path in ("/v1/completions", "/v1/chat/completions"):
            response = await client.get(path)
            assert_openai_error(response)
            assert response.status_code == 405
            assert "POST" in response.headers["allow"]


async def test_a_huge_name_is_not_echoed_back_whole(start_gateway: StartGateway) -> None:
    """A 1 MB model name, a 20 KB policy, pod or pin header value: each refusal quotes the
    value cut to a few hundred characters, in a body of a few KB at most."""
    gw = await start_gateway(engines=1)
    huge = "m" * 1_000_000
    long = "p" * 20_000
    hi = [{"role": "user", "content": "hi"}]
    chat = {"model": MODEL, "messages": hi}
    async with gw.admin() as client:
        answers = [
            await client.post("/v1/chat/completions", json={"model": huge, "messages": hi}),
            await client.post("/v1/completions", json={"model": huge, "prompt": "hi"}),
            await client.post("/v1/embeddings", json={"model": huge, "input": "hi"}),
            await client.post("/admin/match", json={"model": huge, "messages": hi}),
            await client.post("/admin/pin", json={"model": huge, "prompt": "hi"}),
            await client.post("/admin/pin", json={"model": MODEL, "prompt": "hi", "pod": long}),
            await client.post("/admin/unpin", json={"id": long}),
            await client.get(f"/v1/models/{long}"),
            await client.get("/admin/index", params={"pod": long}),
            await client.get("/admin/snapshot", params={"pod": long}),
            await client.post("/v1/chat/completions", headers={"x-kvgate-policy": long}, json=chat),
            await client.post(
                "/v1/chat/completions",
                headers={"x-kvgate-pin": long, "x-kvgate-pin-token": ADMIN_TOKEN},
                json=chat,
            ),
        ]
    for response in answers:
        assert_openai_error(response)
        assert len(response.content) < 2048, (response.request.url.path, len(response.content))
        message = response.json()["error"]["message"]
        assert "m" * 256 + "…" in message or "p" * 256 + "…" in message, message[:80]
