"""The body bytes per prompt token an untokenized prompt is costed at: learned, bounded."""

from __future__ import annotations

import json

import pytest

from gateway.routing.prompt_size import (
    MAX_BYTES_PER_TOKEN,
    MAX_MODELS,
    PRIOR_BYTES_PER_TOKEN,
    PromptSizes,
)
from tests.gateway.conftest import MODEL, StartGateway
from tests.gateway.test_predicted_routing import stream_body


def test_the_prior_until_a_model_is_counted_then_the_traffic_s_own_ratio() -> None:
    sizes = PromptSizes()
    assert sizes.bytes_per_token("m") == PRIOR_BYTES_PER_TOKEN
    assert sizes.tokens("m", 4000) == 1000
    assert sizes.tokens("m", 0) == 1  # never a free prompt
    for _ in range(200):
        sizes.learn("m", 7000, 1000)
    assert sizes.bytes_per_token("m") == pytest.approx(7.0, rel=0.01)
    assert sizes.tokens("m", 7000) == pytest.approx(1000, rel=0.01)
    assert sizes.bytes_per_token("other") == PRIOR_BYTES_PER_TOKEN  # per model


def test_the_estimate_follows_a_change_of_traffic() -> None:
    sizes = PromptSizes()
    for _ in range(300):
        sizes.learn("m", 8000, 1000)
    for _ in range(600):  # 600 requests of 1,000 tokens: three half-lives
        sizes.learn("m", 3000, 1000)
    assert 3.0 < sizes.bytes_per_token("m") < 3.8


def test_a_hostile_body_moves_the_estimate_by_a_bounded_step() -> None:
    sizes = PromptSizes()
    for _ in range(100):
        sizes.learn("m", 5000, 1000)
    before = sizes.bytes_per_token("m")
    sizes.learn("m", 10**9, 8)  # a gigabyte of padding around 8 tokens
    assert sizes.bytes_per_token("m") == pytest.approx(before, rel=0.01)
    sizes.learn("m", 10**9, 10**6)  # one huge prompt weighs no more than a long one
    assert sizes.bytes_per_token("m") < MAX_BYTES_PER_TOKEN
    assert sizes.bytes_per_token("m") < before * 1.2
    sizes.learn("m", 100, 0)  # nothing to learn from
    sizes.learn("m", 0, 100)


def test_the_models_kept_are_bounded() -> None:
    sizes = PromptSizes()
    for index in range(MAX_MODELS + 10):
        sizes.learn(f"m{index}", 6000, 1000)
    assert sizes.bytes_per_token(f"m{MAX_MODELS - 1}") != PRIOR_BYTES_PER_TOKEN
    assert sizes.bytes_per_token(f"m{MAX_MODELS + 5}") == PRIOR_BYTES_PER_TOKEN


async def test_untokenized_prompts_are_costed_by_what_the_engines_counted(
    start_gateway: StartGateway,
) -> None:
    """round-robin tokenizes nothing: the engines' `usage` teaches the gateway how many
    bytes of body a token takes, and predictions follow the prompt's real length."""
    gw = await start_gateway(engines=2, default_policy="round-robin")
    sizes = gw.state.router.prompt_sizes
    assert sizes.bytes_per_token(MODEL) == PRIOR_BYTES_PER_TOKEN
    counted: list[tuple[int, int]] = []
    async with gw.client() as client:
        for index in range(6):
            body = {**stream_body(f"request {index} " + "the cache of the prefix " * 30)}
            body["stream"] = False  # a whole answer carries the engine's usage
            raw = json.dumps(body).encode()
            response = await client.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            assert response.status_code == 200
            assert response.headers["x-kvgate-prompt-blocks"] == "0"  # not tokenized
            counted.append((len(raw), response.json()["usage"]["prompt_tokens"]))
    learned = sizes.bytes_per_token(MODEL)
    truth = sum(b for b, _ in counted) / sum(t for _, t in counted)
    assert learned != PRIOR_BYTES_PER_TOKEN
    # the prior still counts for its 512 tokens; the rest is the traffic's own ratio
    assert abs(learned - truth) < abs(PRIOR_BYTES_PER_TOKEN - truth) / 2
    async with gw.admin() as admin:  # tokenized here: it learns from its own count too
        view = (await admin.post("/admin/match", json=stream_body("explain " * 40))).json()
    assert view["prompt_tokenized"] is True and view["prompt_tokens"] > 40
    assert view["body_bytes_per_token"] == pytest.approx(sizes.bytes_per_token(MODEL))
