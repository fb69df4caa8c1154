"""Envoy's external processing messages, read into typed values and built from them: the
one module of the picker that touches the protobuf classes (xds-protos, which ships no
type stubs; `Pb` marks such an object).

The names are the Gateway API Inference Extension's endpoint picker protocol
(`docs/proposals/004-endpoint-picker-protocol`): the pick goes out as the request header
`x-gateway-destination-endpoint` and as the same value under the dynamic-metadata namespace
`envoy.lb`; the data plane's subset hint comes in `metadata_context.filter_metadata`
under `envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

Pb = Any
"""A protobuf message of xds-protos (untyped)."""

DESTINATION = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
CHUNK_LIMIT = 62_000
"""Bytes per streamed body chunk the picker sends back (the reference picker's bound: some
Envoy builds take at most 64 KiB per chunk)."""

BodyMode = Literal["NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED"]
Phase = Literal["request", "response"]
_MODES: dict[int, BodyMode] = {
    0: "NONE", 1: "STREAMED", 2: "BUFFERED", 3: "BUFFERED_PARTIAL", 4: "FULL_DUPLEX_STREAMED"
}  # fmt: skip
MODE_NUMBERS: dict[BodyMode, int] = {name: number for number, name in _MODES.items()}
_OVERWRITE = base_pb2.HeaderValueOption.HeaderAppendAction.Value("OVERWRITE_IF_EXISTS_OR_ADD")


class Malformed(ValueError):
    """An ext_proc message the picker cannot read (a gRPC INVALID_ARGUMENT)."""


@dataclass(frozen=True, slots=True)
class Modes:
    """The body modes Envoy announces (`protocol_config`, on a stream's first message)."""

    request: BodyMode = "FULL_DUPLEX_STREAMED"
    response: BodyMode = "FULL_DUPLEX_STREAMED"
    body_before_headers_answer: bool = False
    """STREAMED with `send_body_without_waiting_for_header_response`: the body comes
    before the headers are answered."""


@dataclass(frozen=True, slots=True)
class Headers:
    phase: Phase
    values: dict[bytes, bytes]
    """Each header's first value by lower-case name (pseudo-headers included: `:path`)."""
    end_of_stream: bool
    subset: tuple[str, ...] | None
    """The data plane's subset hint (ip:port or ip entries); None: no hint."""
    served: str | None
    """`envoy.lb` / `x-gateway-destination-endpoint-served`, if the data plane reports it."""
    modes: Modes | None
    """None when the message announces no modes."""


@dataclass(frozen=True, slots=True)
class Body:
    phase: Phase
    data: bytes
    end_of_stream: bool


@dataclass(frozen=True, slots=True)
class Trailers:
    phase: Phase


Message = Headers | Body | Trailers


def read(message: Pb) -> Message:
    """A ProcessingRequest as a typed value; Malformed when it carries nothing."""
    kind = message.WhichOneof("request")
    if kind in ("request_headers", "response_headers"):
        http = getattr(message, kind)
        values: dict[bytes, bytes] = {}
        for entry in http.headers.headers:
            raw = entry.raw_value if entry.raw_value else entry.value.encode("utf-8")
            values.setdefault(entry.key.lower().encode("latin-1", "replace"), raw)
        metadata = message.metadata_context.filter_metadata
        return Headers(
            "request" if kind == "request_headers" else "response",
            values,
            bool(http.end_of_stream),
            _subset(metadata),
            _served(metadata),
            _modes(message) if message.HasField("protocol_config") else None,
        )
    if kind in ("request_body", "response_body"):
        body = getattr(message, kind)
        phase: Phase = "request" if kind == "request_body" else "response"
        return Body(phase, bytes(body.body), bool(body.end_of_stream))
    if kind in ("request_trailers", "response_trailers"):
        return Trailers("request" if kind == "request_trailers" else "response")
    raise Malformed("a ProcessingRequest with no headers, body or trailers")


def _modes(message: Pb) -> Modes:
    config = message.protocol_config
    return Modes(
        _MODES.get(config.request_body_mode, "NONE"),
        _MODES.get(config.response_body_mode, "NONE"),
        bool(config.send_body_without_waiting_for_header_response),
    )


def _subset(metadata: Pb) -> tuple[str, ...] | None:
    if SUBSET_NAMESPACE not in metadata:
        return None
    fields = metadata[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    if value.WhichOneof("kind") == "list_value":
        texts = [item.string_value for item in value.list_value.values]
    else:  # a header-to-metadata filter writes the header's text: "ip:port,ip:port"
        texts = [value.string_value]
    return tuple(part.strip() for text in texts for part in text.split(",") if part.strip())


def _served(metadata: Pb) -> str | None:
    if LB_NAMESPACE not in metadata:
        return None
    fields = metadata[LB_NAMESPACE].fields
    return str(fields[SERVED_KEY].string_value) if SERVED_KEY in fields else None


def _pick_common(endpoint: str) -> Pb:
    option = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=DESTINATION, raw_value=endpoint.encode("ascii")),
        append_action=_OVERWRITE,  # never a client's own value beside ours
    )
    return pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=[option]), clear_route_cache=True
    )


def _pick_metadata(endpoint: str) -> Pb:
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION: endpoint}})
    return metadata


def picked_headers(endpoint: str) -> Pb:
    """The request headers' answer naming the pick (header and `envoy.lb` metadata)."""
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=_pick_common(endpoint)),
        dynamic_metadata=_pick_metadata(endpoint),
    )


def picked_body(endpoint: str) -> Pb:
    """A BUFFERED body's answer naming the pick (Envoy holds the headers until then, so the
    header mutation still applies)."""
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=_pick_common(endpoint)),
        dynamic_metadata=_pick_metadata(endpoint),
    )


def continue_headers(phase: Phase) -> Pb:
    answer = pb.HeadersResponse(response=pb.CommonResponse())
    return pb.ProcessingResponse(**{f"{phase}_headers": answer})


def continue_body(phase: Phase) -> Pb:
    answer = pb.BodyResponse(response=pb.CommonResponse())
    return pb.ProcessingResponse(**{f"{phase}_body": answer})


def continue_trailers(phase: Phase) -> Pb:
    return pb.ProcessingResponse(**{f"{phase}_trailers": pb.TrailersResponse()})


def echoed_body(phase: Phase, data: bytes, end_of_stream: bool) -> Iterator[Pb]:
    """FULL_DUPLEX_STREAMED: `data` sent back unchanged, in chunks of at most CHUNK_LIMIT
    bytes (the last one carrying `end_of_stream`)."""
    starts = range(0, len(data), CHUNK_LIMIT) if data else range(1)
    field = f"{phase}_body"
    for start in starts:
        answer = pb.ProcessingResponse()
        # set through the field path: a fifth of the cost of building each level with
        # keywords, once per chunk of every streamed answer
        streamed = getattr(answer, field).response.body_mutation.streamed_response
        streamed.body = data[start : start + CHUNK_LIMIT]
        streamed.end_of_stream = end_of_stream and start + CHUNK_LIMIT >= len(data)
        yield answer


def immediate(status: int, body: bytes, headers: dict[str, str]) -> Pb:
    """The data plane answers the client itself: `status`, `headers` and `body`."""
    options = [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=name, raw_value=value.encode("latin-1")),
            append_action=_OVERWRITE,
        )
        for name, value in headers.items()
    ]
    answer = pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=pb.HeaderMutation(set_headers=options),
        body=body,
        details=f"kvgate_epp_{status}",
    )
    return pb.ProcessingResponse(immediate_response=answer)
