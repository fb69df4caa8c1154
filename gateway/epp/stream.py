"""One ext_proc stream (one HTTP request through the data plane) as the picker plays it.

Request side, by the body mode Envoy announces (`protocol_config`; FULL_DUPLEX_STREAMED
when it announces none, as the Inference Extension configures it):

- FULL_DUPLEX_STREAMED: nothing is answered until the whole body has arrived; then the
  headers' answer naming the endpoint, then the body sent back unchanged.
- STREAMED with `send_body_without_waiting_for_header_response`: the same order; each body
  chunk answered (unchanged) after the headers'.
- BUFFERED, BUFFERED_PARTIAL, STREAMED otherwise: the headers are answered at once (Envoy
  sends no body before); each chunk before the last at once; the last one's answer names
  the endpoint (Envoy still holds the headers in BUFFERED mode, so the header applies).

A request the proxy would refuse is answered with an ImmediateResponse carrying the
proxy's status and OpenAI-style body, and the stream ends. Response side: headers and
body chunks are observed (status, first byte, usage) and passed on unchanged; the end of
the answer (end_of_stream, trailers) or of the stream releases the request's booking,
exactly once.
"""

from __future__ import annotations

import json
import time

from gateway.epp import protocol
from gateway.epp.picker import Booking, Picker, kind_of
from gateway.epp.protocol import Body, Headers, Message, Modes, Pb, Trailers
from gateway.errors import BadRequest, GatewayError
from gateway.http.turn import Headers as HeaderValues
from gateway.routing.router import Kind

_HEADERS_FIRST = ("BUFFERED", "BUFFERED_PARTIAL", "STREAMED")


class StreamError(Exception):
    """The stream ends with a gRPC error `code` (a grpc.StatusCode name)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _invalid(details: str) -> StreamError:
    return StreamError("INVALID_ARGUMENT", details)


class PickStream:
    """The state of one stream; `handle` answers each message in order."""

    def __init__(self, picker: Picker, peer: str) -> None:
        self._picker = picker
        self._peer = peer
        self._headers: Headers | None = None
        self._modes = Modes()
        self._kind: Kind = "chat"
        self._chunks: list[bytes] = []
        self._size = 0
        self._body_ended = False
        self.booking: Booking | None = None
        self.finished = False
        """An ImmediateResponse was sent: the data plane answers the client, nothing follows."""

    @property
    def _headers_first(self) -> bool:
        mode = self._modes.request
        return mode in _HEADERS_FIRST and not (
            mode == "STREAMED" and self._modes.body_before_headers_answer
        )

    async def handle(self, message: Message) -> list[Pb]:
        if message.phase == "request":
            if isinstance(message, Headers):
                return self._request_headers(message)
            if isinstance(message, Body):
                return await self._request_body(message)
            answers = await self._complete()
            return answers if self.finished else [*answers, protocol.continue_trailers("request")]
        return self._response(message)

    @property
    def picked(self) -> bool:
        return self.booking is not None

    @property
    def started(self) -> bool:
        """The request headers arrived."""
        return self._headers is not None

    def close(self) -> None:
        """The stream ended: a request still in flight is released as abandoned."""
        if self.booking is not None and not self.booking.released:
            self.booking.release("client_disconnect")

    def stalled(self) -> None:
        """The answer stopped coming: released as the proxy releases an upstream timeout."""
        if self.booking is not None and not self.booking.released:
            self.booking.release("504")
            upstream = self._picker.gateway.metrics.upstream
            upstream.upstream_errors.labels(self.booking.state.name, "timeout").inc()

    def _request_headers(self, message: Headers) -> list[Pb]:
        if self._headers is not None:
            raise _invalid("request headers sent twice on one stream")
        self._headers = message
        self._modes = message.modes or Modes()
        if self._modes.request == "NONE":
            raise StreamError(
                "FAILED_PRECONDITION",
                "request_body_mode NONE: the picker routes on the request body; configure "
                "FULL_DUPLEX_STREAMED or BUFFERED",
            )
        try:
            self._kind = kind_of(message.values.get(b":path", b"").decode("latin-1"))
            if message.end_of_stream:
                raise BadRequest("a chat or completion request needs its JSON body")
        except GatewayError as error:
            return self.refuse(error)
        return [protocol.continue_headers("request")] if self._headers_first else []

    async def _request_body(self, message: Body) -> list[Pb]:
        if self._headers is None:
            raise _invalid("a request body before the request headers")
        if self._body_ended:
            raise _invalid("a request body after its end_of_stream")
        self._size += len(message.data)
        try:
            self._picker.check_size(self._size)
        except GatewayError as error:
            return self.refuse(error)
        self._chunks.append(message.data)
        if message.end_of_stream:
            return await self._complete()
        return [protocol.continue_body("request")] if self._headers_first else []

    async def _complete(self) -> list[Pb]:
        """The whole body is in: pick, and answer what is held."""
        if self._headers is None:
            raise _invalid("request trailers before the request headers")
        if self._body_ended:
            return []
        self._body_ended = True
        started = time.perf_counter()
        raw = b"".join(self._chunks)
        headers: HeaderValues = self._headers.values
        try:
            self.booking = booking = await self._picker.pick(
                self._kind, raw, headers, self._headers.subset, self._client(headers)
            )
        except GatewayError as error:
            return self.refuse(error)
        endpoint = booking.endpoint
        mode = self._modes.request
        if self._headers_first:
            answers = [protocol.picked_body(endpoint)]
        elif mode == "STREAMED":
            answers = [protocol.picked_headers(endpoint)]
            answers += [protocol.continue_body("request") for _ in self._chunks]
        else:
            answers = [protocol.picked_headers(endpoint),
                       *protocol.echoed_body("request", raw, True)]  # fmt: skip
        self._chunks = []
        metrics = self._picker.gateway.metrics.epp
        metrics.picks.labels("picked").inc()
        metrics.pick_seconds.observe(time.perf_counter() - started)
        return answers

    def _client(self, headers: HeaderValues) -> str:
        """The client's address as the data plane saw it: its `X-Forwarded-For` read as
        the proxy reads a trusted proxy's (`TrustedProxies.client`; the data plane is one
        by being the picker's peer), else the data plane's own."""
        return self._picker.proxies.client(self._peer, headers.items())

    def refuse(self, error: GatewayError) -> list[Pb]:
        """Answer with an ImmediateResponse carrying `error`; the stream ends."""
        self._picker.refused(error)
        self.finished = True
        body = json.dumps(error.body()).encode()
        headers = {"content-type": "application/json", **error.headers()}
        return [protocol.immediate(error.status, body, headers)]

    def _response(self, message: Message) -> list[Pb]:
        booking = self.booking
        if booking is None:
            raise _invalid("a response message before the request was picked")
        if isinstance(message, Headers):
            status = message.values.get(b":status", b"0")
            booking.answered(int(status) if status.isdigit() else 0)
            if message.end_of_stream:
                booking.release()
            return [protocol.continue_headers("response")]
        if isinstance(message, Trailers):
            booking.release()
            return [protocol.continue_trailers("response")]
        assert isinstance(message, Body)
        booking.chunk(message.data)
        if message.end_of_stream:
            booking.release()
        if self._modes.response == "FULL_DUPLEX_STREAMED":
            return list(protocol.echoed_body("response", message.data, message.end_of_stream))
        return [protocol.continue_body("response")]
