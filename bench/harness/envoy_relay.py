"""Envoy's part in front of an endpoint picker (`kvgate epp`), for the load generators:
one chat completion request sent as the Gateway API Inference Extension's Envoy sends it.

For each request: open an ext_proc stream, send the request headers and the body in
FULL_DUPLEX_STREAMED (as the Inference Extension configures Envoy), read the endpoint the
picker names (`x-gateway-destination-endpoint`) and the body it sends back, send that body
straight to the endpoint (`http://ip:port` + path), and relay the answer through the
stream: the response headers with their status, each body chunk as it arrives, then the
end of stream. What the client sees is what the picker sends back (Envoy forwards the
processed body), read as `post_chat` reads a proxy's answer; the clock starts at the
client's send, so a TTFT includes the pick. An ImmediateResponse is the client's answer
(its status and body, as Envoy answers it); an endpoint that refuses the connection is a
503, as Envoy answers when its upstream connect fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from bench.harness.streaming import ChatAnswer
from gateway.epp.client import Answer, EnvoyClient, EnvoyStream, request_pick
from gateway.epp.protocol import DESTINATION

ERROR_BYTES = 200
"""Bytes of a refused answer's body kept in its error text (as `post_chat` keeps)."""


@dataclass(slots=True)
class Relayed:
    """One request's answer as the client saw it, and the endpoint the picker named."""

    answer: ChatAnswer
    endpoint: str | None = None
    picked: float | None = None
    """When the picker named the endpoint (the clock's time)."""


class _Lines:
    """SSE lines out of body chunks cut anywhere."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, data: bytes) -> list[str]:
        *lines, self._tail = (self._tail + data).split(b"\n")
        return [line.rstrip(b"\r").decode() for line in lines]

    def rest(self) -> list[str]:
        tail, self._tail = self._tail, b""
        return [tail.rstrip(b"\r").decode()] if tail else []


class EnvoyRelay:
    """Requests through the picker at `envoy`, sent to the endpoints it picks with the
    httpx client `clients()` hands out; `timeout_s` bounds each request, start to end."""

    def __init__(
        self,
        envoy: EnvoyClient,
        clients: Callable[[], httpx.AsyncClient],
        *,
        timeout_s: float = 120.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._envoy = envoy
        self._clients = clients
        self.timeout_s = timeout_s
        self._clock = clock

    async def post_chat(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Relayed:
        """POST `body` (a streamed chat completion) through the picker; never raises for
        a failed request: the answer says how it failed."""
        relayed = Relayed(ChatAnswer(self._clock()))
        answer = relayed.answer
        stream = self._envoy.stream()
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._exchange(stream, path, body, headers or {}, relayed)
        except TimeoutError:
            answer.error, answer.failure = f"timeout after {self.timeout_s:g} s", "timeout"
        except grpc.aio.AioRpcError as exc:  # Envoy fails closed: the client gets a 500
            answer.error = f"ext_proc {exc.code().name}: {exc.details()}"
            answer.failure = "reset" if answer.status is None else "cut"
        except (httpx.HTTPError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            answer.error = f"{type(exc).__name__}: {exc}"
            answer.failure = "cut" if answer.status is not None else "reset"
        finally:
            stream.cancel()  # a no-op on a stream that ended; else the data plane drops it
        answer.ended = self._clock()
        return relayed

    async def _exchange(
        self,
        stream: EnvoyStream,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        relayed: Relayed,
    ) -> None:
        answer = relayed.answer
        answers = await request_pick(stream, path, json.dumps(body).encode(), headers=headers)
        last = answers[-1]
        if last.kind == "immediate_response":
            answer.status, answer.failure = last.status, "status"
            answer.headers = httpx.Headers(last.headers)
            answer.error = f"HTTP {last.status}: {last.immediate_body[:ERROR_BYTES]!r}"
            return
        endpoint = next((a.destination for a in answers if a.destination), None)
        if endpoint is None:
            answer.error, answer.failure = f"the picker named no endpoint: {answers}", "reset"
            return
        relayed.endpoint, relayed.picked = endpoint, self._clock()
        forwarded = b"".join(a.body for a in answers if a.body is not None)
        await self._forward(stream, endpoint, path, forwarded, headers, answer)

    async def _forward(
        self,
        stream: EnvoyStream,
        endpoint: str,
        path: str,
        content: bytes,
        headers: dict[str, str],
        answer: ChatAnswer,
    ) -> None:
        """The request to `endpoint`, its answer relayed through the stream while the
        picker's answers (the body sent back) are read as they come (full duplex)."""
        sent = {**headers, "content-type": "application/json", DESTINATION: endpoint}
        client = self._clients()
        try:
            async with client.stream(
                "POST", f"http://{endpoint}{path}", content=content, headers=sent
            ) as response:
                answer.headers = response.headers  # the pod's, as Envoy passes them on
                await stream.response_headers(response.status_code, served=endpoint)
                back = asyncio.create_task(self._back(stream, response.status_code, answer))
                try:
                    try:
                        async for part in response.aiter_bytes():
                            await stream.response_body(part, end_of_stream=False)
                        await stream.response_body(b"", end_of_stream=True)
                        await stream.done_writing()
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                        pass  # the stream ended early: its reader says how
                    await back
                finally:
                    if not back.done():
                        back.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await back
        except httpx.ConnectError as exc:  # Envoy's own answer when its upstream refuses
            answer.status, answer.failure = 503, "connect"
            answer.error = f"HTTP 503: upstream connect error ({endpoint}): {exc}"

    async def _back(self, stream: EnvoyStream, status: int, answer: ChatAnswer) -> None:
        """The picker's answers on the response side, up to the stream's end: the headers'
        (the status reaches the client), then the body as sent back, read as the client
        reads it."""
        lines = _Lines()
        refused = bytearray()
        ended = False
        while (each := await stream.read()) is not None:
            if each.kind == "response_headers":
                answer.status = status
                continue
            if not _response_body(each):
                continue
            now = self._clock()
            if status == 200:
                for line in lines.feed(each.body or b""):
                    answer.feed(line, now)
            else:
                refused += (each.body or b"")[: ERROR_BYTES - len(refused)]
            ended = ended or each.end_of_stream
        if status != 200:
            answer.failure = "status"
            answer.error = f"HTTP {status}: {bytes(refused)!r}"
            return
        for line in lines.rest():
            answer.feed(line, self._clock())
        if not (answer.done and ended):
            answer.failure = "cut"


def _response_body(answer: Answer) -> bool:
    return answer.kind == "response_body" and answer.body is not None
