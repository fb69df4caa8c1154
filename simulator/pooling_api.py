"""vLLM's pooling endpoints: `/v1/embeddings`, `/pooling`, `/score` and `/rerank`.

A real vLLM serves these with a pooling model (`--task embed` / `score`); the simulator
serves them beside generation, answering at once (no scheduling, no KV cache). A text's
vector is deterministic: the mean of a fixed pseudo-random vector per token id, L2
normalised, `EMBEDDING_DIM` floats. A pair's score is the cosine of its two vectors mapped
to [0, 1]. Shapes follow vLLM's `EmbeddingResponse`, `PoolingResponse`, `ScoreResponse`
and `RerankResponse`; `encoding_format` is `float` or `base64` (little-endian float32, what
the `openai` SDK asks for by default); `dimensions` is refused (not a matryoshka model).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import struct
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from simulator.engine import SimEngine
from simulator.openai_api import RequestError, check_model, read_json

EMBEDDING_DIM = 64


@functools.lru_cache(maxsize=65_536)
def _token_vector(token: int) -> tuple[float, ...]:
    digest = hashlib.blake2b(token.to_bytes(8, "little"), digest_size=EMBEDDING_DIM).digest()
    return tuple((byte - 127.5) / 127.5 for byte in digest)


def embed(tokens: list[int]) -> list[float]:
    """The deterministic vector of `tokens` (all zeros for no tokens)."""
    total = [0.0] * EMBEDDING_DIM
    for token in tokens:
        for i, value in enumerate(_token_vector(token)):
            total[i] += value
    norm = math.sqrt(sum(value * value for value in total))
    return [value / norm for value in total] if norm else total


def _tokens_of(engine: SimEngine, item: Any, param: str) -> list[int]:
    if isinstance(item, str):
        tokens = engine.tokenizer.encode(item, add_special_tokens=True)
    elif isinstance(item, list) and all(type(t) is int for t in item):
        if not all(engine.tokenizer.is_valid(t) for t in item):
            raise RequestError(f"{param} contains token ids outside the vocabulary", param=param)
        tokens = list(item)
    else:
        raise RequestError(
            f"{param} must be a string, a list of strings or token ids, or a list of lists of "
            "token ids",
            param=param,
        )
    limit = engine.config.max_model_len
    if len(tokens) > limit:
        raise RequestError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(tokens)} tokens in the input for embedding generation. Please reduce the "
            "length of the input.",
            param=param,
        )
    return tokens


def _inputs(engine: SimEngine, value: Any, param: str) -> list[list[int]]:
    """`input` as vLLM takes it: a string, a list of strings, token ids or lists of them."""
    if isinstance(value, str) or (
        isinstance(value, list) and value and all(type(t) is int for t in value)
    ):
        return [_tokens_of(engine, value, param)]
    if isinstance(value, list) and value:
        return [_tokens_of(engine, item, param) for item in value]
    raise RequestError(f"{param} must be a non-empty string or list", param=param)


def _encode(vector: list[float], encoding_format: Any) -> list[float] | str:
    if encoding_format in (None, "float"):
        return vector
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    raise RequestError(
        f"encoding_format must be 'float' or 'base64', got {encoding_format!r}",
        param="encoding_format",
    )


def _usage(tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


async def _body(engine: SimEngine, request: Request) -> dict[str, Any]:
    body = await read_json(request)
    check_model(engine, body)
    return body


async def embeddings(engine: SimEngine, request: Request) -> Response:
    body = await _body(engine, request)
    if body.get("dimensions") is not None:
        raise RequestError(
            f'Model "{engine.config.model}" does not support matryoshka representation, '
            "changing output dimensions will lead to poor results.",
            param="dimensions",
        )
    return _vectors(engine, body, "embd", "embedding", "embedding")


async def pooling(engine: SimEngine, request: Request) -> Response:
    body = await _body(engine, request)
    return _vectors(engine, body, "pool", "pooling", "data")


def _vectors(
    engine: SimEngine, body: dict[str, Any], prefix: str, kind: str, field: str
) -> Response:
    """One vector per input, as vLLM lists them for /v1/embeddings and /pooling."""
    inputs = _inputs(engine, body.get("input"), "input")
    data = [
        {"index": i, "object": kind, field: _encode(embed(tokens), body.get("encoding_format"))}
        for i, tokens in enumerate(inputs)
    ]
    return _listing(engine, prefix, data, sum(len(tokens) for tokens in inputs))


def _listing(engine: SimEngine, prefix: str, data: list[dict[str, Any]], tokens: int) -> Response:
    """vLLM's list envelope of a pooling-style answer: id, model, data and token usage."""
    return JSONResponse(
        {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": engine.config.model,
            "data": data,
            "usage": _usage(tokens),
        }
    )


def _score(query: list[int], document: list[int]) -> float:
    cosine = sum(a * b for a, b in zip(embed(query), embed(document), strict=True))
    return min(1.0, max(0.0, (cosine + 1.0) / 2.0))


def _texts(engine: SimEngine, value: Any, param: str) -> list[list[int]]:
    if isinstance(value, str):
        return [_tokens_of(engine, value, param)]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return [_tokens_of(engine, item, param) for item in value]
    raise RequestError(f"{param} must be a string or a non-empty list of strings", param=param)


async def score(engine: SimEngine, request: Request) -> Response:
    """`text_1` against `text_2`: one to many, or pairwise when both are lists."""
    body = await _body(engine, request)
    first = _texts(engine, body.get("text_1"), "text_1")
    second = _texts(engine, body.get("text_2"), "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise RequestError("text_1 and text_2 must have the same number of items")
    pairs = list(zip(first, second, strict=True))
    data = [
        {"index": i, "object": "score", "score": _score(a, b)} for i, (a, b) in enumerate(pairs)
    ]
    return _listing(engine, "score", data, sum(len(a) + len(b) for a, b in pairs))


async def rerank(engine: SimEngine, request: Request) -> Response:
    """`documents` ranked by their score against `query`, best first, `top_n` of them."""
    body = await _body(engine, request)
    query = body.get("query")
    if not isinstance(query, str):
        raise RequestError("query must be a string", param="query")
    documents = body.get("documents")
    if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
        raise RequestError("documents must be a list of strings", param="documents")
    top_n = body.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 0):
        raise RequestError("top_n must be a non-negative integer", param="top_n")
    query_tokens = _tokens_of(engine, query, "query")
    scored = []
    total = 0
    for index, document in enumerate(documents):
        tokens = _tokens_of(engine, document, "documents")
        total += len(query_tokens) + len(tokens)
        scored.append((_score(query_tokens, tokens), index, document))
    scored.sort(key=lambda item: (-item[0], item[1]))
    if top_n:
        scored = scored[:top_n]
    results = [
        {"index": index, "document": {"text": document}, "relevance_score": value}
        for value, index, document in scored
    ]
    return JSONResponse(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": engine.config.model,
            "usage": {"total_tokens": total},
            "results": results,
        }
    )
