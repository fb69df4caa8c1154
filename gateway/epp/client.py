"""Envoy's side of the ext_proc exchange, as its ext_proc filter plays it: what the tests
and `kvgate bench overhead` use to ask a running picker (`kvgate epp`) for endpoints, and
a way to try one by hand.

`EnvoyStream` is one HTTP request's stream: it sends what Envoy sends (request headers with
the modes and the subset hint, body chunks, response headers and body chunks) and reads the
picker's answers as typed `Answer`s. `request_pick` plays a request's whole request side
in one body mode and returns where the picker sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from google.protobuf import struct_pb2

from gateway.epp.protocol import (
    DESTINATION,
    LB_NAMESPACE,
    MODE_NUMBERS,
    SERVED_KEY,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
    BodyMode,
    Modes,
)


@dataclass(slots=True)
class Answer:
    """One ProcessingResponse, read."""

    kind: str
    """Which response: request_headers, request_body, response_headers, response_body,
    request_trailers, response_trailers or immediate_response."""
    destination: str | None = None
    """The `x-gateway-destination-endpoint` header the answer sets."""
    metadata_destination: str | None = None
    """The same under the dynamic metadata's `envoy.lb`."""
    clear_route_cache: bool = False
    body: bytes | None = None
    """A streamed body chunk sent back (FULL_DUPLEX_STREAMED)."""
    end_of_stream: bool = False
    status: int = 0
    """An immediate response's status, its headers and body."""
    headers: dict[str, str] = field(default_factory=dict)
    immediate_body: bytes = b""


def _read(response: Any) -> Answer:
    kind = response.WhichOneof("response")
    answer = Answer(kind)
    if kind == "immediate_response":
        immediate = response.immediate_response
        answer.status = int(immediate.status.code)
        answer.immediate_body = bytes(immediate.body)
        answer.headers = {
            option.header.key: bytes(option.header.raw_value).decode("latin-1")
            for option in immediate.headers.set_headers
        }
        return answer
    common = getattr(response, kind).response if kind.endswith(("headers", "body")) else None
    if common is not None:
        answer.clear_route_cache = bool(common.clear_route_cache)
        for option in common.header_mutation.set_headers:
            if option.header.key == DESTINATION:
                answer.destination = bytes(option.header.raw_value).decode("latin-1")
        if common.body_mutation.HasField("streamed_response"):
            streamed = common.body_mutation.streamed_response
            answer.body = bytes(streamed.body)
            answer.end_of_stream = bool(streamed.end_of_stream)
    metadata = response.dynamic_metadata.fields
    if LB_NAMESPACE in metadata:
        fields = metadata[LB_NAMESPACE].struct_value.fields
        if DESTINATION in fields:
            answer.metadata_destination = str(fields[DESTINATION].string_value)
    return answer


def _metadata(namespace: str, key: str, value: Any) -> Any:
    entry = struct_pb2.Struct()
    entry.update({key: value})
    return base_pb2.Metadata(filter_metadata={namespace: entry})


def _header_map(headers: dict[str, str]) -> Any:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )


class EnvoyStream:
    """One ext_proc stream (one HTTP request), Envoy's side."""

    def __init__(self, call: Any) -> None:
        self._call = call

    async def request_headers(
        self,
        path: str,
        headers: dict[str, str] | None = None,
        *,
        modes: Modes | None = None,
        subset: list[str] | str | None = None,
        end_of_stream: bool = False,
    ) -> None:
        """`subset`: the hint as a list, or as the text a header-to-metadata filter writes."""
        every = {":method": "POST", ":path": path, ":authority": "kvgate",
                 "content-type": "application/json", **(headers or {})}  # fmt: skip
        message = pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(headers=_header_map(every), end_of_stream=end_of_stream)
        )
        if modes is not None:
            config = message.protocol_config
            config.request_body_mode = MODE_NUMBERS[modes.request]
            config.response_body_mode = MODE_NUMBERS[modes.response]
            config.send_body_without_waiting_for_header_response = modes.body_before_headers_answer
        if subset is not None:
            message.metadata_context.CopyFrom(_metadata(SUBSET_NAMESPACE, SUBSET_KEY, subset))
        await self._call.write(message)

    async def request_body(self, data: bytes, *, end_of_stream: bool) -> None:
        body = pb.HttpBody(body=data, end_of_stream=end_of_stream)
        await self._call.write(pb.ProcessingRequest(request_body=body))

    async def response_headers(
        self, status: int, *, served: str | None = None, end_of_stream: bool = False
    ) -> None:
        headers = _header_map({":status": str(status), "content-type": "text/event-stream"})
        message = pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(headers=headers, end_of_stream=end_of_stream)
        )
        if served is not None:
            message.metadata_context.CopyFrom(_metadata(LB_NAMESPACE, SERVED_KEY, served))
        await self._call.write(message)

    async def response_body(self, data: bytes, *, end_of_stream: bool) -> None:
        body = pb.HttpBody(body=data, end_of_stream=end_of_stream)
        await self._call.write(pb.ProcessingRequest(response_body=body))

    async def send_raw(self, message: Any) -> None:
        """Any ProcessingRequest, as is (a malformed one, in tests)."""
        await self._call.write(message)

    async def read(self) -> Answer | None:
        """The next answer; None when the picker ended the stream (OK)."""
        response = await self._call.read()
        if response is grpc.aio.EOF:
            return None
        return _read(response)

    async def done_writing(self) -> None:
        await self._call.done_writing()

    def cancel(self) -> None:
        """The data plane drops the stream (its client went away)."""
        self._call.cancel()

    async def code(self) -> grpc.StatusCode:
        """The stream's final gRPC status."""
        status: grpc.StatusCode = await self._call.code()
        return status


class EnvoyClient:
    """A channel to a picker (`target`: `host:port`); `stream()` opens one request's."""

    def __init__(
        self,
        target: str,
        *,
        root_certificates: bytes | None = None,
        client_pair: tuple[bytes, bytes] | None = None,
    ) -> None:
        """`root_certificates`: TLS, trusting these (PEM); `client_pair`: (key, chain), the
        client certificate mutual TLS asks for."""
        if root_certificates is None:
            self._channel = grpc.aio.insecure_channel(target)
        else:
            key, chain = client_pair or (None, None)
            credentials = grpc.ssl_channel_credentials(root_certificates, key, chain)
            self._channel = grpc.aio.secure_channel(target, credentials)
        self._stub = external_processor_pb2_grpc.ExternalProcessorStub(self._channel)

    def stream(self) -> EnvoyStream:
        return EnvoyStream(self._stub.Process())

    async def wait_ready(self) -> None:
        """Until the channel is connected (as Envoy keeps its connection to the picker)."""
        await self._channel.channel_ready()

    async def close(self) -> None:
        await self._channel.close()


async def request_pick(
    stream: EnvoyStream,
    path: str,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
    mode: BodyMode = "FULL_DUPLEX_STREAMED",
    chunks: int = 1,
    subset: list[str] | str | None = None,
    body_first: bool = False,
) -> list[Answer]:
    """Play a request's request side in `mode` (the body in `chunks` pieces; `body_first`:
    STREAMED with send_body_without_waiting_for_header_response) and return the picker's
    answers up to the one naming the endpoint (or an immediate response)."""
    modes = Modes(mode, mode, body_first)
    await stream.request_headers(path, headers, modes=modes, subset=subset)
    answers: list[Answer] = []
    headers_first = mode in ("BUFFERED", "BUFFERED_PARTIAL") or (
        mode == "STREAMED" and not body_first
    )
    if headers_first:  # Envoy waits for the headers' answer before sending the body
        answer = await _next(stream)
        answers.append(answer)
        if answer.kind == "immediate_response":
            return answers
    size = max(1, -(-len(body) // chunks))
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        await stream.request_body(piece, end_of_stream=last)
        if headers_first:  # each chunk answered in turn, the last one naming the endpoint
            answers.append(await _next(stream))
            if answers[-1].kind == "immediate_response":
                return answers
    if headers_first:
        return answers
    # The headers' answer, then the body's: one per chunk (STREAMED), or the body sent
    # back until its end_of_stream (FULL_DUPLEX_STREAMED).
    remaining = len(pieces) if mode == "STREAMED" else None
    answers.append(await _next(stream))
    while answers[-1].kind != "immediate_response":
        if remaining is not None and remaining == 0:
            break
        answer = await _next(stream)
        answers.append(answer)
        if remaining is not None:
            remaining -= 1
        elif answer.end_of_stream:
            break
    return answers


async def _next(stream: EnvoyStream) -> Answer:
    answer = await stream.read()
    if answer is None:
        raise ConnectionError("the picker ended the stream")
    return answer
