"""One chat completion request as the load generators send it, what its answer carried
(the status, the serving pod, when each piece of generated text arrived, the text, the
usage chunk, how the request failed if it did), and the record every benchmark keeps of
it.

TTFT is taken at the first chunk carrying generated text (the first SSE chunk only
announces the role and comes before prefill).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(slots=True)
class ChatAnswer:
    started: float
    ended: float = 0.0
    status: int | None = None
    """None: no HTTP status came back."""
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    error: str | None = None
    """What went wrong, for a person: `HTTP 503: b'…'`, `ReadTimeout: …`."""
    failure: str | None = None
    """What went wrong, as a class: `connect` (refused), `reset` (the connection failed
    before a status), `cut` (after it; or a stream without its `[DONE]`), `status` (not
    200), `timeout`."""
    token_times: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    """The stream ended with `data: [DONE]`."""

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.started if self.token_times else None

    @property
    def itl_s(self) -> float | None:
        """The mean gap between the later chunks of generated text."""
        times = self.token_times
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    @property
    def cached_tokens(self) -> int:
        details = self.usage.get("prompt_tokens_details")
        return _int(details.get("cached_tokens")) if isinstance(details, dict) else 0

    def usage_int(self, key: str) -> int:
        return _int(self.usage.get(key))

    def feed(self, line: str, now: float) -> None:
        """One line of an SSE stream."""
        if line == "data: [DONE]":
            self.done = True
        if not line.startswith("data: ") or self.done:
            return
        chunk = json.loads(line[6:])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.token_times.append(now)
                self.text.append(content)
                break


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


async def post_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> ChatAnswer:
    """POST `body` to `url` (a chat completions endpoint) and read the whole answer; a
    streamed one (`body["stream"]`) chunk by chunk. Never raises for a failed request: the
    answer says how it failed."""
    answer = ChatAnswer(clock())
    stream = bool(body.get("stream"))
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            answer.status, answer.headers = response.status_code, response.headers
            if response.status_code != 200:
                answer.failure = "status"
                answer.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            elif stream:
                async for line in response.aiter_lines():
                    answer.feed(line, clock())
                if not answer.done:
                    answer.failure = "cut"
            else:
                await response.aread()
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, httpx.TimeoutException):
            answer.failure = "timeout"
        elif isinstance(exc, httpx.ConnectError):
            answer.failure = "connect"
        else:
            answer.failure = "cut" if answer.status is not None else "reset"
    answer.ended = clock()
    return answer


@dataclass(frozen=True, slots=True)
class RequestRecord:
    started: float
    ended: float
    status: int | None
    """None: no HTTP status came back."""
    error: str | None
    """None when the request got a complete answer."""
    pod: str | None = None
    """The pod that served it (`x-kvgate-pod`), when the router says."""
    stream: bool = True
    conversation: str = ""
    tag: str = ""
    turn: int = 0
    ttft_s: float | None = None
    """Seconds from sending the request to the first generated text."""
    itl_s: float | None = None
    chunks: int = 0
    """Chunks that carried generated text."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    predicted_ttft_s: float | None = None
    """kvgate's prediction for the pod that served (`x-kvgate-predicted-ttft-ms`), if any."""
    predicted_tpot_s: float | None = None
    """kvgate's predicted time per output token there (`x-kvgate-predicted-tpot-ms`)."""
    router_url: str = ""
    """Which router (gateway replica) the request was sent to, when there are several."""
    pick_s: float | None = None
    """Through an endpoint picker: seconds from sending the request to the endpoint named."""

    @property
    def e2e_s(self) -> float:
        """Seconds from sending the request to the end of the answer."""
        return self.ended - self.started

    @classmethod
    def of(
        cls,
        answer: ChatAnswer,
        *,
        error: str | None,
        stream: bool = True,
        conversation: str = "",
        tag: str = "",
        turn: int = 0,
        router_url: str = "",
    ) -> RequestRecord:
        """The record of `answer`, with `error` as the benchmark classes failures."""
        return cls(
            started=answer.started,
            ended=answer.ended,
            status=answer.status,
            error=error,
            pod=answer.headers.get("x-kvgate-pod"),
            stream=stream,
            conversation=conversation,
            tag=tag,
            turn=turn,
            ttft_s=answer.ttft_s,
            itl_s=answer.itl_s,
            chunks=len(answer.token_times),
            prompt_tokens=answer.usage_int("prompt_tokens"),
            cached_tokens=answer.cached_tokens,
            completion_tokens=answer.usage_int("completion_tokens"),
            predicted_ttft_s=_seconds(answer.headers.get("x-kvgate-predicted-ttft-ms")),
            predicted_tpot_s=_seconds(answer.headers.get("x-kvgate-predicted-tpot-ms")),
            router_url=router_url,
        )


def _seconds(milliseconds: str | None) -> float | None:
    try:
        return float(milliseconds) / 1e3 if milliseconds is not None else None
    except ValueError:
        return None
