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
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench.harness.streaming import RequestRecord, post_chat
from bench.workloads.chat import ChatWorkload, Session


@dataclass(frozen=True, slots=True)
class LoadSpec:
    gateway_url: str
    model: str
    policy: str
    time_scale: float


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
    url = f"{spec.gateway_url}/v1/chat/completions"
    answer = await post_chat(client, url, body, headers)
    record = RequestRecord.of(
        answer, error=answer.error, conversation=session.session_id, turn=turn
    )
    return record, "".join(answer.text)


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
