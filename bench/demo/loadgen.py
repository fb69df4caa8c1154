"""The demo's load generator: every session of a chat workload as one asyncio task
(closed loop: a session sends its next turn only after the answer and a think time).

Requests are streamed chat completions through the gateway, with the routing policy in
the `x-kvgate-policy` header. TTFT is measured at the first chunk that carries generated
text (the first SSE chunk only announces the role and comes before prefill); the pod is
read from `x-kvgate-pod`; usage (with cached tokens) from the final usage chunk.
Think times and start offsets are model seconds, divided by the time scale.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench.workloads import ChatWorkload, Session


@dataclass(frozen=True, slots=True)
class RequestRecord:
    session: str
    turn: int
    pod: str | None
    status: int
    error: str | None
    ttft_s: float | None
    """Wall seconds from sending the request to the first generated text."""
    e2e_s: float
    """Wall seconds from sending the request to the end of the stream."""
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    started: float
    finished: float


@dataclass(frozen=True, slots=True)
class LoadSpec:
    gateway_url: str
    model: str
    policy: str
    time_scale: float


class _Stream:
    """What one streamed answer carried."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.first_token_at: float | None = None
        self.usage: dict[str, object] = {}

    def feed(self, line: str) -> None:
        if not line.startswith("data: ") or line == "data: [DONE]":
            return
        chunk = json.loads(line[6:])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        for choice in chunk.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                if self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                self.text.append(content)


async def send_turn(
    client: httpx.AsyncClient,
    spec: LoadSpec,
    workload: ChatWorkload,
    session: Session,
    turn: int,
    answers: list[str],
) -> tuple[RequestRecord, str]:
    """Send one turn; returns its record and the answer text."""
    body = {
        "model": spec.model,
        "messages": workload.messages(session, turn, answers),
        "max_tokens": session.turns[turn].max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-kvgate-policy": spec.policy, "x-session-id": session.session_id}
    stream = _Stream()
    started = time.perf_counter()
    status, pod, error = 0, None, None
    try:
        url = f"{spec.gateway_url}/v1/chat/completions"
        async with client.stream("POST", url, json=body, headers=headers) as response:
            status, pod = response.status_code, response.headers.get("x-kvgate-pod")
            if status != 200:
                error = f"HTTP {status}: {(await response.aread())[:200]!r}"
            else:
                async for line in response.aiter_lines():
                    stream.feed(line)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finished = time.perf_counter()
    details = stream.usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    record = RequestRecord(
        session=session.session_id,
        turn=turn,
        pod=pod,
        status=status,
        error=error,
        ttft_s=None if stream.first_token_at is None else stream.first_token_at - started,
        e2e_s=finished - started,
        prompt_tokens=_int(stream.usage.get("prompt_tokens")),
        cached_tokens=_int(cached),
        completion_tokens=_int(stream.usage.get("completion_tokens")),
        started=started,
        finished=finished,
    )
    return record, "".join(stream.text)


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


async def run_load(
    spec: LoadSpec,
    workload: ChatWorkload,
    on_done: Callable[[RequestRecord], None] = lambda record: None,
) -> list[RequestRecord]:
    """Run every session of `workload` concurrently through the gateway; all records."""
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=len(workload.sessions))
    timeout = httpx.Timeout(120.0, connect=5.0)

    async def converse(client: httpx.AsyncClient, session: Session) -> None:
        await asyncio.sleep(session.start_s / spec.time_scale)
        answers: list[str] = []
        for turn in range(len(session.turns)):
            record, answer = await send_turn(client, spec, workload, session, turn, answers)
            records.append(record)
            on_done(record)
            answers.append(answer)
            if turn + 1 < len(session.turns):
                await asyncio.sleep(session.turns[turn].think_s / spec.time_scale)

    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout) as client,
        asyncio.TaskGroup() as group,
    ):
        for session in workload.sessions:
            group.create_task(converse(client, session), name=f"demo-{session.session_id}")
    return records
