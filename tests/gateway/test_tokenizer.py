"""RemoteTokenizer against a real simulated engine's /tokenize; TokenizeInput parsing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.upstream.http1 import Http1Pool
from gateway.upstream.tokenizer import RemoteTokenizer, TokenizeInput, TokenizerError
from simulator import EngineServer
from tests.conftest import StartEngine
from tests.helpers import free_port

MODEL = "sim-model"
PROMPT = (
    "The gateway sends each request to the engine that already holds the longest prefix "
    "of its prompt in cache, so the prefill is shorter and the answer comes sooner."
)
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain how a radix tree stores a prefix cache."},
]


class Recorder(Http1Pool):
    """The real pool, noting each URL it is asked to POST to."""

    def __init__(self) -> None:
        super().__init__(connect_timeout_s=5.0, read_timeout_s=30.0)
        self.urls: list[str] = []

    async def post(self, url: str, body: bytes, **kwargs: Any) -> tuple[int, bytes]:
        self.urls.append(url)
        return await super().post(url, body, **kwargs)


@pytest.fixture
async def sent() -> AsyncIterator[Recorder]:
    pool = Recorder()
    yield pool
    await pool.aclose()


@pytest.fixture
def client(sent: Recorder) -> Recorder:
    return sent


@pytest.fixture
async def engine(start_engine: StartEngine) -> EngineServer:
    return await start_engine(name="tok")


def make(client: Http1Pool, **kwargs: Any) -> RemoteTokenizer:
    options: dict[str, Any] = {"timeout_s": 5.0, "max_retries": 1, "cache_size": 16}
    options.update(kwargs)
    return RemoteTokenizer(client, **options)


def completion_input(prompt: Any, **extra: Any) -> TokenizeInput:
    what = TokenizeInput.for_completion({"model": MODEL, "prompt": prompt, **extra})
    assert isinstance(what, TokenizeInput)
    return what


def vllm(*urls: str) -> list[tuple[str, str]]:
    """Pods (URL, engine kind) of vLLM engines."""
    return [(url, "vllm") for url in urls]


async def engine_tokenize(
    client: Http1Pool, server: EngineServer, body: dict[str, Any]
) -> list[int]:
    async with httpx.AsyncClient() as direct:  # straight to the engine, not through the pool
        response = await direct.post(f"{server.url}/tokenize", json={"model": MODEL, **body})
    assert response.status_code == 200
    tokens: list[int] = response.json()["tokens"]
    return tokens


async def generate(
    client: Http1Pool, server: EngineServer, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as direct:
        response = await direct.post(
            f"{server.url}{path}", json={"model": MODEL, "max_tokens": 1, **body}
        )
    assert response.status_code == 200, response.text
    usage: dict[str, Any] = response.json()["usage"]
    return usage


# -- against a real engine ------------------------------------------------------------------


async def test_a_prompt_tokenizes_as_the_engine_does(
    engine: EngineServer, client: Http1Pool
) -> None:
    tokenizer = make(client)
    ids = await tokenizer.tokenize(completion_input(PROMPT), vllm(engine.url))
    assert ids == await engine_tokenize(client, engine, {"prompt": PROMPT})
    block = engine.engine.config.block_size
    assert len(ids) >= 2 * block

    # The engine sees the same prompt: same length, and the text prompt hits the cache the
    # token-id prompt filled (full blocks match only if the ids are the same).
    first = await generate(client, engine, "/v1/completions", {"prompt": ids})
    assert first["prompt_tokens"] == len(ids)
    second = await generate(client, engine, "/v1/completions", {"prompt": PROMPT})
    assert second["prompt_tokens"] == len(ids)
    assert second["prompt_tokens_details"]["cached_tokens"] >= block * (len(ids) // block - 1)


async def test_chat_messages_tokenize_as_the_engine_does(
    engine: EngineServer, client: Http1Pool
) -> None:
    tokenizer = make(client)
    what = TokenizeInput.for_chat({"model": MODEL, "messages": MESSAGES, "temperature": 0.5})
    assert "temperature" not in what.body  # only fields that change the tokens
    ids = await tokenizer.tokenize(what, vllm(engine.url))
    assert ids == await engine_tokenize(client, engine, {"messages": MESSAGES})
    usage = await generate(client, engine, "/v1/chat/completions", {"messages": MESSAGES})
    assert usage["prompt_tokens"] == len(ids)

    # A field that changes the rendering is sent along, and keyed apart.
    bare = TokenizeInput.for_chat(
        {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": False}
    )
    assert bare.key != what.key
    bare_ids = await tokenizer.tokenize(bare, vllm(engine.url))
    assert bare_ids == await engine_tokenize(
        client, engine, {"messages": MESSAGES, "add_generation_prompt": False}
    )
    assert bare_ids != ids
    assert tokenizer.misses == 2


async def test_add_special_tokens_is_passed_to_the_engine(
    engine: EngineServer, client: Http1Pool
) -> None:
    tokenizer = make(client)
    plain = completion_input(PROMPT, add_special_tokens=False)
    assert plain.body["add_special_tokens"] is False
    ids = await tokenizer.tokenize(plain, vllm(engine.url))
    assert ids == await engine_tokenize(
        client, engine, {"prompt": PROMPT, "add_special_tokens": False}
    )
    default = await tokenizer.tokenize(completion_input(PROMPT), vllm(engine.url))
    assert default != ids


async def test_a_repeat_is_answered_from_the_cache(
    engine: EngineServer, client: Http1Pool, sent: Recorder
) -> None:
    tokenizer = make(client)
    first = await tokenizer.tokenize(completion_input(PROMPT), vllm(engine.url))
    assert (tokenizer.hits, tokenizer.misses, len(sent.urls)) == (0, 1, 1)
    # Same content, keys in another order: the same cache entry.
    again = TokenizeInput.for_completion({"prompt": PROMPT, "model": MODEL})
    assert isinstance(again, TokenizeInput)
    assert await tokenizer.tokenize(again, vllm(engine.url)) == first
    assert (tokenizer.hits, tokenizer.misses, len(sent.urls)) == (1, 1, 1)
    # Chat and completion inputs never share an entry.
    chat = TokenizeInput.for_chat({"model": MODEL, "messages": MESSAGES})
    await tokenizer.tokenize(chat, vllm(engine.url))
    assert (tokenizer.hits, tokenizer.misses, len(sent.urls)) == (1, 2, 2)
    # Another model's prompt is another key.
    other = TokenizeInput.for_completion({"model": "other", "prompt": PROMPT})
    assert isinstance(other, TokenizeInput) and other.key != again.key


async def test_the_cache_is_a_bounded_lru(
    engine: EngineServer, client: Http1Pool, sent: Recorder
) -> None:
    tokenizer = make(client, cache_size=2)
    a, b, c = (completion_input(f"prompt number {n}") for n in ("one", "two", "three"))
    urls = [engine.url]
    await tokenizer.tokenize(a, vllm(*urls))
    await tokenizer.tokenize(b, vllm(*urls))
    await tokenizer.tokenize(a, vllm(*urls))  # hit: a is now the most recently used
    await tokenizer.tokenize(c, vllm(*urls))  # evicts b, the least recently used
    assert (tokenizer.hits, tokenizer.misses) == (1, 3)
    await tokenizer.tokenize(a, vllm(*urls))
    await tokenizer.tokenize(c, vllm(*urls))
    assert (tokenizer.hits, tokenizer.misses) == (3, 3)
    await tokenizer.tokenize(b, vllm(*urls))  # was evicted: asked again
    assert (tokenizer.hits, tokenizer.misses) == (3, 4)
    assert len(sent.urls) == 4


async def test_a_zero_size_cache_caches_nothing(
    engine: EngineServer, client: Http1Pool, sent: Recorder
) -> None:
    tokenizer = make(client, cache_size=0)
    for _ in range(3):
        await tokenizer.tokenize(completion_input(PROMPT), vllm(engine.url))
    assert (tokenizer.hits, tokenizer.misses, len(sent.urls)) == (0, 3, 3)


async def test_a_dead_url_is_retried_then_fails(client: Http1Pool, sent: Recorder) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    tokenizer = make(client, max_retries=2)
    with pytest.raises(TokenizerError) as caught:
        await tokenizer.tokenize(completion_input(PROMPT), vllm(dead))
    assert f"{dead}/tokenize failed" in str(caught.value)
    assert sent.urls == [f"{dead}/tokenize"] * 3  # one try and two retries
    assert (tokenizer.hits, tokenizer.misses, tokenizer.failures) == (0, 1, 1)
    # Failures are not cached: the next call tries again.
    with pytest.raises(TokenizerError):
        await tokenizer.tokenize(completion_input(PROMPT), vllm(dead))
    assert len(sent.urls) == 6
    assert tokenizer.failures == 2


async def test_no_retries_means_one_try(client: Http1Pool, sent: Recorder) -> None:
    tokenizer = make(client, max_retries=0)
    with pytest.raises(TokenizerError):
        await tokenizer.tokenize(completion_input(PROMPT), vllm(f"http://127.0.0.1:{free_port()}"))
    assert len(sent.urls) == 1


async def test_a_retry_goes_to_the_next_pod(
    engine: EngineServer, client: Http1Pool, sent: Recorder
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    tokenizer = make(client, max_retries=1)
    ids = await tokenizer.tokenize(completion_input(PROMPT), vllm(dead, engine.url))
    assert ids == await engine_tokenize(client, engine, {"prompt": PROMPT})
    assert sent.urls[:2] == [f"{dead}/tokenize", f"{engine.url}/tokenize"]
    assert tokenizer.failures == 0


async def test_calls_take_turns_over_the_pods(
    start_engine: StartEngine, client: Http1Pool, sent: Recorder
) -> None:
    """Tokenizing is CPU on an engine's API server: spread, so one slow pod does not hold up
    every request's routing."""
    first, second = await start_engine(name="tok-a"), await start_engine(name="tok-b")
    tokenizer = make(client)
    for i in range(4):
        await tokenizer.tokenize(completion_input(f"{PROMPT} {i}"), vllm(first.url, second.url))
    assert sent.urls == [f"{first.url}/tokenize", f"{second.url}/tokenize"] * 2


async def test_a_fixed_endpoint_overrides_the_pods(
    engine: EngineServer, client: Http1Pool, sent: Recorder
) -> None:
    tokenizer = make(client, endpoint=engine.url)
    dead = f"http://127.0.0.1:{free_port()}"
    ids = await tokenizer.tokenize(completion_input(PROMPT), vllm(dead))
    assert ids
    assert sent.urls == [f"{engine.url}/tokenize"]
    assert await make(client, endpoint=engine.url).tokenize(completion_input(PROMPT), []) == ids


async def test_no_endpoint_at_all_fails(client: Http1Pool, sent: Recorder) -> None:
    tokenizer = make(client)
    with pytest.raises(TokenizerError, match="no endpoint"):
        await tokenizer.tokenize(completion_input(PROMPT), [])
    assert tokenizer.failures == 1
    assert sent.urls == []


async def test_an_engine_error_is_a_tokenizer_error(
    engine: EngineServer, client: Http1Pool
) -> None:
    tokenizer = make(client, max_retries=0)
    wrong = TokenizeInput.for_completion({"model": "not-served", "prompt": PROMPT})
    assert isinstance(wrong, TokenizeInput)
    with pytest.raises(TokenizerError, match="answered 404"):
        await tokenizer.tokenize(wrong, vllm(engine.url))
    # A server that is not an engine: 404 on /tokenize as well.
    with pytest.raises(TokenizerError, match="answered 404"):
        await tokenizer.tokenize(completion_input(PROMPT), vllm(f"{engine.url}/elsewhere"))


async def test_a_silent_server_times_out(client: Http1Pool, sent: Recorder) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def never_answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        tokenizer = make(client, timeout_s=0.2, max_retries=1)
        with pytest.raises(TokenizerError, match=r"timed out after 0\.2 s"):
            await tokenizer.tokenize(completion_input(PROMPT), vllm(f"http://127.0.0.1:{port}"))
        assert len(sent.urls) == 2
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("tokens", [[1, 2**32], [1, -1], [1, True], "12"])
async def test_an_engine_answering_unusable_token_ids_is_a_tokenizer_error(
    client: Http1Pool, tokens: Any
) -> None:
    """Ids the gateway could not hash are the engine's fault (routing degrades), not the
    client's (a 400 about its prompt)."""
    body = json.dumps({"tokens": tokens}).encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        tokenizer = make(client, max_retries=0)
        with pytest.raises(TokenizerError, match="malformed token ids"):
            await tokenizer.tokenize(completion_input(PROMPT), vllm(f"http://127.0.0.1:{port}"))
    finally:
        server.close()
        await server.wait_closed()


# -- TokenizeInput.for_completion -----------------------------------------------------------


def test_token_id_prompts_are_used_as_they_are() -> None:
    assert TokenizeInput.for_completion({"model": MODEL, "prompt": [5, 6, 7]}) == [5, 6, 7]
    # One prompt in a list (the OpenAI batch form with a single entry).
    assert TokenizeInput.for_completion({"model": MODEL, "prompt": [[5, 6, 7]]}) == [5, 6, 7]
    text = TokenizeInput.for_completion({"model": MODEL, "prompt": ["hello"]})
    assert isinstance(text, TokenizeInput)
    assert text.body == {"model": MODEL, "prompt": "hello"}


def test_the_body_keeps_only_what_changes_the_tokens() -> None:
    what = TokenizeInput.for_completion(
        {"model": MODEL, "prompt": "hi", "max_tokens": 5, "add_special_tokens": False}
    )
    assert isinstance(what, TokenizeInput)
    assert what.body == {"model": MODEL, "prompt": "hi", "add_special_tokens": False}


@pytest.mark.parametrize(
    "prompt",
    [
        ["one", "two"],  # several prompts
        [[1, 2], [3, 4]],  # several token-id prompts
        [],
        [[]],
        None,
        42,
        ["one", 2],
        {"text": "hi"},
    ],
)
def test_unusable_prompts_are_tokenizer_errors(prompt: Any) -> None:
    body: dict[str, Any] = {"model": MODEL}
    if prompt is not None:
        body["prompt"] = prompt
    with pytest.raises(TokenizerError):
        TokenizeInput.for_completion(body)


def test_token_ids_are_taken_as_validated() -> None:
    """Which token ids are valid (no booleans, within [0, 2**32)) is the API's check
    (tests/reliability/test_bad_input.py); here a list of ints is token ids by its shape."""
    assert TokenizeInput.for_completion({"model": MODEL, "prompt": [0, 2**32 - 1]}) == [
        0,
        2**32 - 1,
    ]


def test_a_one_token_prompt_is_token_ids() -> None:
    assert TokenizeInput.for_completion({"model": MODEL, "prompt": [5]}) == [5]
