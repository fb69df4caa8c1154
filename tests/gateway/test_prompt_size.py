"""The body bytes per prompt token an untokenized prompt is costed at: learned, bounded."""

from __future__ import annotations

import json

import httpx
import pytest
import xxhash

from gateway.routing.prompt_size import (
    MAX_BYTES_PER_TOKEN,
    MAX_CLIENTS_PER_MODEL,
    MAX_MODELS,
    MIN_BYTES_PER_TOKEN,
    PRIOR_BYTES_PER_TOKEN,
    PromptSizes,
)
from tests.gateway.conftest import MODEL, StartGateway
from tests.gateway.test_predicted_routing import stream_body


def test_the_prior_until_a_client_is_counted_then_its_own_ratio() -> None:
    sizes = PromptSizes()
    assert sizes.bytes_per_token("m", "a") == PRIOR_BYTES_PER_TOKEN
    assert sizes.tokens("m", "a", 4000) == 1000
    assert sizes.tokens("m", "a", 0) == 1  # never a free prompt
    for _ in range(200):
        sizes.learn("m", "a", 7000, 1000)
    assert sizes.bytes_per_token("m", "a") == pytest.approx(7.0, rel=0.01)
    assert sizes.tokens("m", "a", 7000) == pytest.approx(1000, rel=0.01)
    assert sizes.bytes_per_token("other", "a") == PRIOR_BYTES_PER_TOKEN  # per model
    # one client's figure is not another's: below three clients, a new one gets the prior
    assert sizes.bytes_per_token("m", "b") == PRIOR_BYTES_PER_TOKEN


def test_the_estimate_follows_a_change_of_traffic() -> None:
    sizes = PromptSizes()
    for _ in range(300):
        sizes.learn("m", "a", 8000, 1000)
    for _ in range(600):  # 600 requests of 1,000 tokens: three half-lives
        sizes.learn("m", "a", 3000, 1000)
    assert 3.0 < sizes.bytes_per_token("m", "a") < 3.8


def test_a_hostile_body_moves_its_own_client_s_estimate_by_a_bounded_step() -> None:
    sizes = PromptSizes()
    for _ in range(100):
        sizes.learn("m", "a", 5000, 1000)
    before = sizes.bytes_per_token("m", "a")
    sizes.learn("m", "a", 10**9, 8)  # a gigabyte of padding around 8 tokens
    assert sizes.bytes_per_token("m", "a") == pytest.approx(before, rel=0.01)
    sizes.learn("m", "a", 10**9, 10**6)  # one huge prompt weighs no more than a long one
    assert sizes.bytes_per_token("m", "a") < MAX_BYTES_PER_TOKEN
    assert sizes.bytes_per_token("m", "a") < before * 1.2
    sizes.learn("m", "a", 100, 0)  # nothing to learn from
    sizes.learn("m", "a", 0, 100)


@pytest.mark.parametrize("hostile_ratio", [MIN_BYTES_PER_TOKEN, MAX_BYTES_PER_TOKEN])
def test_one_client_cannot_move_another_s_estimate(hostile_ratio: float) -> None:
    """Padded bodies (many bytes per token) or token-dense ones (few): however many, one
    client moves its own estimate only; a client not seen yet gets the clients' median."""
    sizes = PromptSizes()
    for client, ratio in (("victim", 5.0), ("b", 4.5), ("c", 5.5)):
        for _ in range(50):
            sizes.learn("m", client, int(ratio * 1000), 1000)
    victim = sizes.bytes_per_token("m", "victim")
    newcomer = sizes.bytes_per_token("m", "new")
    assert newcomer == pytest.approx(5.0, rel=0.02)  # the median of 4.5, 5.0, 5.5
    for _ in range(4000):
        sizes.learn("m", "hostile", int(hostile_ratio * 2048), 2048)
    assert sizes.bytes_per_token("m", "hostile") == pytest.approx(hostile_ratio, rel=0.05)
    assert sizes.bytes_per_token("m", "victim") == victim
    assert 4.5 <= sizes.bytes_per_token("m", "new") <= 5.5  # a median of four: still theirs


def test_the_models_and_clients_kept_are_bounded() -> None:
    sizes = PromptSizes()
    for index in range(MAX_MODELS + 10):
        sizes.learn(f"m{index}", "a", 6000, 1000)
    assert sizes.bytes_per_token(f"m{MAX_MODELS - 1}", "a") != PRIOR_BYTES_PER_TOKEN
    assert sizes.bytes_per_token(f"m{MAX_MODELS + 5}", "a") == PRIOR_BYTES_PER_TOKEN
    for index in range(MAX_CLIENTS_PER_MODEL + 10):
        sizes.learn("m0", f"c{index}", 6000, 1000)
    assert sizes.bytes_per_token("m0", "c0") == sizes.bytes_per_token("m0", "never seen")
    assert sizes.bytes_per_token("m0", f"c{MAX_CLIENTS_PER_MODEL + 9}") != PRIOR_BYTES_PER_TOKEN


async def test_untokenized_prompts_are_costed_by_what_the_engines_counted(
    start_gateway: StartGateway,
) -> None:
    """round-robin tokenizes nothing: the engines' `usage` teaches the gateway how many
    bytes of body a token takes, and predictions follow the prompt's real length."""
    gw = await start_gateway(engines=2, default_policy="round-robin")
    sizes = gw.state.router.prompt_sizes
    sender = "addr:127.0.0.1"  # the test client, as `gateway.http.api.client_key` names it
    assert sizes.bytes_per_token(MODEL, sender) == PRIOR_BYTES_PER_TOKEN
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
    learned = sizes.bytes_per_token(MODEL, sender)
    truth = sum(b for b, _ in counted) / sum(t for _, t in counted)
    assert learned != PRIOR_BYTES_PER_TOKEN
    # the prior still counts for its 512 tokens; the rest is the traffic's own ratio
    assert abs(learned - truth) < abs(PRIOR_BYTES_PER_TOKEN - truth) / 2
    async with gw.admin() as admin:  # tokenized here: it learns from its own count too
        view = (await admin.post("/admin/match", json=stream_body("explain " * 40))).json()
    assert view["prompt_tokenized"] is True and view["prompt_tokens"] > 40
    assert view["body_bytes_per_token"] == pytest.approx(sizes.bytes_per_token(MODEL))


async def test_a_client_padding_its_bodies_does_not_change_another_s_cost(
    start_gateway: StartGateway,
) -> None:
    """round-robin on a remotely tokenized model: prompts are costed from their bodies.
    A client that pads its bodies with whitespace (many bytes per token) teaches only its
    own estimate: another client's chat is predicted as before."""
    gw = await start_gateway(engines=1, default_policy="round-robin")
    text = "the cache of the prefix " * 300
    chat = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
    victim = json.dumps(chat).encode()
    padded = json.dumps({**chat, "messages": [{"role": "user", "content": "hi"}]}).encode()
    padded = padded[:-1] + b" " * 60_000 + b"}"
    headers = {"content-type": "application/json"}
    sizes = gw.state.router.prompt_sizes

    async def victim_prediction(client: httpx.AsyncClient) -> float:
        answer = await client.post("/v1/chat/completions", content=victim, headers=headers)
        assert answer.status_code == 200
        return float(answer.headers["x-kvgate-predicted-ttft-ms"])

    victim_key = "addr:127.0.0.1"
    async with gw.client() as client:
        await victim_prediction(client)  # the victim's own count, from the engine's usage
        await victim_prediction(client)
        learned = sizes.bytes_per_token(MODEL, victim_key)
        costed = sizes.tokens(MODEL, victim_key, len(victim))
        fleet = sizes.bytes_per_token(MODEL)
        async with gw.client(headers={"authorization": "Bearer attacker"}) as attacker:
            for _ in range(40):
                sent = await attacker.post("/v1/chat/completions", content=padded, headers=headers)
                assert sent.status_code == 200
        # The victim's prompt is costed at the same size (its predicted TTFT moves only
        # with what the cost model learns of the engine, not with the attacker's bodies),
        # and a client without estimates of its own gets the fleet's, unmoved by one client.
        assert sizes.bytes_per_token(MODEL, victim_key) == learned
        assert sizes.tokens(MODEL, victim_key, len(victim)) == costed
        assert sizes.bytes_per_token(MODEL) == fleet
        await victim_prediction(client)
    attacker_key = f"key:{xxhash.xxh64_hexdigest(b'Bearer attacker')}"
    assert sizes.bytes_per_token(MODEL, attacker_key) > 2 * learned  # its own, skewed
