"""vLLM-compatible OpenAI endpoints: `/v1/completions` and `/v1/chat/completions`.

(`/v1/responses` is in `responses_api.py`, the pooling endpoints in `pooling_api.py`.)

Non-streaming answers carry `usage.prompt_tokens_details.cached_tokens`; streaming answers
are SSE chunks ending with `data: [DONE]`, plus a final usage chunk (empty `choices`) when
`stream_options.include_usage` is set. A client that goes away aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from simulator.engine import SimEngine
from simulator.scheduler import SimRequest
from tokenization import ChatRenderError, NotRenderable, too_long

logger = logging.getLogger(__name__)


class MidstreamCloseError(ConnectionAbortedError):
    """Raised inside a streaming body to cut the connection (the `close_midstream` fault)."""


class RequestError(ValueError):
    """A bad request body; becomes an OpenAI-style error with `status`."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


Handler = Callable[[Request], Awaitable[Response]]


def guarded(handler: Handler) -> Handler:
    """`handler` with its `RequestError`s answered as OpenAI-style errors."""

    async def wrapper(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(str(exc), exc.status, exc.param)

    return wrapper


def error_response(message: str, status: int, param: str | None = None) -> JSONResponse:
    kinds = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    body = {
        "error": {
            "message": message,
            "type": kinds.get(
                status, "InternalServerError" if status >= 500 else "BadRequestError"
            ),
            "param": param,
            "code": status,
        }
    }
    return JSONResponse(body, status_code=status)


async def read_json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body


def check_model(engine: SimEngine, body: dict[str, Any]) -> None:
    model = body.get("model")
    if model is not None and model != engine.config.model and model not in engine.config.loras:
        raise RequestError(
            f"The model `{model}` does not exist. Valid aliases: {engine.config.model}.",
            status=404,
            param="model",
        )


def prompt_tokens(
    engine: SimEngine, body: dict[str, Any], *, chat: bool, served: bool = False
) -> list[int]:
    """Token ids of a completion `prompt` or chat `messages`, as `/tokenize` computes them
    (`chat`: the body is a `/v1/chat/completions` request, whose template arguments vLLM
    merges in more). `served`: the prompt is to be generated from, so, as vLLM, a prompt
    text longer than `max_model_len` × the vocabulary's longest token is refused before it
    is tokenized (`/tokenize` checks no length)."""
    if chat or "messages" in body:
        try:
            text = engine.tokenizer.render_chat(body, completions=chat)
        except ChatRenderError as exc:  # what vLLM answers 400 to, with the reason
            raise RequestError(str(exc)) from exc
        except NotRenderable as exc:
            # Media parts (a text-only model refuses them too) or the request's own chat
            # template (vLLM refuses it unless started with --trust-request-chat-template).
            raise RequestError(str(exc)) from exc
        if served:
            _check_characters(engine, body, text)
        add_special = body.get("add_special_tokens", False)
        if not isinstance(add_special, bool):
            raise RequestError("add_special_tokens must be a boolean")
        return engine.tokenizer.encode_rendered(text, add_special_tokens=add_special)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    add_special = bool(body.get("add_special_tokens", True))
    if isinstance(prompt, str):
        if served:
            _check_characters(engine, body, prompt)
        return engine.tokenizer.encode(prompt, add_special_tokens=add_special)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        # vLLM validates with pydantic in lax mode: a JSON true/false is the token id 1/0,
        # and the engine stores and publishes ints.
        ids = [int(t) for t in prompt]
        if not all(engine.tokenizer.is_valid(t) for t in ids):
            raise RequestError("prompt contains token ids outside the vocabulary", param="prompt")
        return ids
    raise RequestError("prompt must be a string or a list of token ids", param="prompt")


def _check_characters(engine: SimEngine, body: dict[str, Any], text: str) -> None:
    """vLLM's check before tokenizing: no token covers more characters than the longest."""
    if body.get("truncate_prompt_tokens") is not None:
        return
    refused = too_long(len(text), engine.config.max_model_len, engine.tokenizer.max_chars_per_token)
    if refused is not None:
        raise RequestError(refused, param="input_text")


def requested_max_tokens(engine: SimEngine, body: dict[str, Any], prompt_len: int) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        value = engine.config.default_max_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"max_tokens must be a positive integer, got {value!r}")
    limit = engine.config.max_model_len
    if prompt_len + value > limit or not engine.cache.can_fit(prompt_len + value):
        raise RequestError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + value} tokens ({prompt_len} in the messages, {value} in the "
            "completion). Please reduce the length of the messages or completion.",
        )
    return value


def _usage(req: SimRequest) -> dict[str, Any]:
    prompt, completion = len(req.prompt), len(req.generated)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


async def handle_generation(engine: SimEngine, request: Request, *, chat: bool) -> Response:
    body = await read_json(request)
    check_model(engine, body)
    prompt = prompt_tokens(engine, body, chat=chat, served=True)
    max_tokens = requested_max_tokens(engine, body, len(prompt))
    status = engine.faults.take_request_failure()
    if status is not None:
        return error_response("injected failure (sim fault)", status)
    sim = engine.new_request(prompt, max_tokens)
    kind = "chatcmpl" if chat else "cmpl"
    client_id = request.headers.get("x-request-id")
    engine.received_trace_context.append(
        (request.headers.get("traceparent"), request.headers.get("tracestate"))
    )
    # As vLLM: the request is named after the client's X-Request-Id, echoed in the answer.
    headers = {"x-request-id": client_id} if client_id else None
    if client_id:
        engine.received_request_ids.append(client_id)
        logger.debug("%s: request %s is X-Request-Id %s", engine.config.name, sim.request_id,
                     client_id)  # fmt: skip
    response_id = f"{kind}-{client_id or uuid.uuid4().hex}"
    created = int(time.time())
    model = engine.config.model
    if body.get("stream"):
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
        close_early = engine.faults.take_midstream_close()
        engine.submit(sim)
        chunks = _stream(engine, sim, chat, response_id, created, model, include_usage, close_early)
        return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
    engine.submit(sim)
    try:
        if not await generated_before_client_left(sim, request):
            return Response(status_code=499)  # nobody is listening; the request is aborted
        if sim.killed:
            return error_response("the engine restarted (sim fault)", 503)
    finally:
        engine.finish(sim)
    text = engine.tokenizer.decode(sim.generated)
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        choice["stop_reason"] = None
    return JSONResponse(
        {
            "id": response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": _usage(sim),
        },
        headers=headers,
    )


async def generated_before_client_left(sim: SimRequest, request: Request) -> bool:
    """Wait for the whole answer, unless the client disconnects first (like vLLM's
    `with_cancellation`: a non-streamed request is aborted when its client goes)."""
    left = False

    async def watch_client() -> None:
        nonlocal left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        left = True
        sim.stream.put_nowait(None)  # ends the wait below at once

    watch = asyncio.ensure_future(watch_client())
    try:
        while await sim.stream.get() is not None:
            pass
    finally:
        watch.cancel()
    return not left


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _stream(
    engine: SimEngine,
    sim: SimRequest,
    chat: bool,
    response_id: str,
    created: int,
    model: str,
    include_usage: bool,
    close_early: bool,
) -> AsyncIterator[str]:
    base = {
        "id": response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
    }

    def chunk(text: str | None, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice]}

    try:
        sent = 0
        while (token := await sim.stream.get()) is not None:
            if chat and sent == 0:  # as vLLM and SGLang: the role chunk comes with the first
                yield _sse(chunk(None, None, role=True))  # output, after the prefill
            sent += 1
            done = len(sim.generated) >= sim.max_tokens and sent == sim.max_tokens
            yield _sse(chunk(engine.tokenizer.decode([token]), "length" if done else None))
            if close_early:
                raise MidstreamCloseError("sim fault: stream closed mid-way")
        if sim.killed:  # the engine restarted: its connections drop
            raise MidstreamCloseError("sim fault: the engine restarted")
        if include_usage:
            yield _sse({**base, "choices": [], "usage": _usage(sim)})
        yield "data: [DONE]\n\n"
    finally:
        engine.finish(sim)
