"""vLLM's `/v1/responses`, minimal: text in, one assistant message out.

`input` is a string or a list of messages (`{"role", "content"}`, content a string or
`input_text` parts); `instructions` becomes a system message; `max_output_tokens` bounds
the answer. Generation runs through the engine like a chat completion (same template, same
cache). Not streamed: a `response` object. Streamed: SSE `event:`/`data:` pairs from
`response.created` to `response.completed` (no `[DONE]`), each with a `sequence_number`.
No tools, no reasoning, no stored responses (`previous_response_id` is refused).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from simulator.engine import SimEngine
from simulator.openai_api import (
    MidstreamCloseError,
    RequestError,
    check_model,
    error_response,
    generated_before_client_left,
    prompt_tokens,
    read_json,
    requested_max_tokens,
)
from simulator.scheduler import SimRequest


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("instructions must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    value = body.get("input")
    if isinstance(value, str):
        return [*messages, {"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise RequestError("input must be a string or a non-empty list", param="input")
    for item in value:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise RequestError("input items must be messages", param="input")
        content = item.get("content")
        if isinstance(content, list):
            texts = [
                part.get("text") for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            ]  # fmt: skip
            content = "".join(str(text) for text in texts)
        if not isinstance(content, str) or not isinstance(item.get("role"), str):
            raise RequestError("an input message needs a role and text content", param="input")
        messages.append({"role": item["role"], "content": content})
    return messages


def _usage(sim: SimRequest) -> dict[str, Any]:
    prompt, output = len(sim.prompt), len(sim.generated)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": sim.cached_tokens},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _message(item_id: str, text: str, status: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [
        {"type": "output_text", "text": text, "annotations": [], "logprobs": None}
    ]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": content if status == "completed" else []}  # fmt: skip


def _response(
    base: dict[str, Any], status: str, output: list[dict[str, Any]], usage: Any
) -> dict[str, Any]:
    return {**base, "status": status, "output": output, "usage": usage}


async def responses(engine: SimEngine, request: Request) -> Response:
    body = await read_json(request)
    check_model(engine, body)
    if body.get("previous_response_id") is not None:
        raise RequestError("stored responses are not supported", param="previous_response_id")
    prompt = prompt_tokens(engine, {"messages": _messages(body)}, chat=True, served=True)
    limits = {"max_tokens": body["max_output_tokens"]} if "max_output_tokens" in body else {}
    max_tokens = requested_max_tokens(engine, limits, len(prompt))
    status = engine.faults.take_request_failure()
    if status is not None:
        return error_response("injected failure (sim fault)", status)
    sim = engine.new_request(prompt, max_tokens)
    base: dict[str, Any] = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": engine.config.model,
        "instructions": body.get("instructions"),
        "max_output_tokens": max_tokens,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "incomplete_details": None,
        "error": None,
        "metadata": body.get("metadata"),
    }
    item_id = f"msg_{uuid.uuid4().hex}"
    engine.submit(sim)
    if body.get("stream"):
        return StreamingResponse(
            _stream(engine, sim, base, item_id), media_type="text/event-stream"
        )
    try:
        if not await generated_before_client_left(sim, request):
            return Response(status_code=499)
        if sim.killed:
            return error_response("the engine restarted (sim fault)", 503)
    finally:
        engine.finish(sim)
    message = _message(item_id, engine.tokenizer.decode(sim.generated), "completed")
    return JSONResponse(_response(base, "completed", [message], _usage(sim)))


async def _stream(
    engine: SimEngine, sim: SimRequest, base: dict[str, Any], item_id: str
) -> AsyncIterator[str]:
    sequence = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal sequence
        payload = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"

    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    try:
        yield event("response.created", response=_response(base, "in_progress", [], None))
        yield event("response.in_progress", response=_response(base, "in_progress", [], None))
        yield event("response.output_item.added", output_index=0,
                    item=_message(item_id, "", "in_progress"))  # fmt: skip
        part = {"type": "output_text", "text": "", "annotations": []}
        yield event("response.content_part.added", **where, part=part)
        while (token := await sim.stream.get()) is not None:
            delta = engine.tokenizer.decode([token])
            yield event("response.output_text.delta", **where, delta=delta, logprobs=[])
        if sim.killed:
            raise MidstreamCloseError("sim fault: the engine restarted")
        text = engine.tokenizer.decode(sim.generated)
        yield event("response.output_text.done", **where, text=text, logprobs=[])
        yield event("response.content_part.done", **where, part={**part, "text": text})
        message = _message(item_id, text, "completed")
        yield event("response.output_item.done", output_index=0, item=message)
        done = _response(base, "completed", [message], _usage(sim))
        yield event("response.completed", response=done)
    finally:
        engine.finish(sim)
