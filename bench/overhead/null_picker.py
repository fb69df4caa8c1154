"""The pick phase's baseline: an ext_proc server that names a fixed endpoint without routing.

`python -m bench.overhead.null_picker ENDPOINT` serves Envoy's `ExternalProcessor` on a
free loopback port (printed on stdout) and answers every stream with the same messages
`kvgate epp` sends, read and built by the same code (`gateway.epp.protocol`), but with no
decision behind them. Timed beside `kvgate epp` by the same client, it is what the gRPC
exchange itself costs that client, so that the difference is what a pick adds.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

from gateway.epp import protocol
from gateway.epp.protocol import Body, Headers, Modes, Pb


class NullProcessor:
    """`ExternalProcessor.Process`, answering as the picker does in BUFFERED and
    FULL_DUPLEX_STREAMED modes, always with `endpoint`."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint

    async def Process(  # noqa: N802  # the gRPC method's name
        self, requests: AsyncIterator[Pb], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Pb]:
        modes = Modes()
        chunks: list[bytes] = []
        async for request in requests:
            message = protocol.read(request)
            buffered = modes.request == "BUFFERED"
            if isinstance(message, Headers) and message.phase == "request":
                modes = message.modes or Modes()
                if modes.request == "BUFFERED":
                    yield protocol.continue_headers("request")
            elif isinstance(message, Body) and message.phase == "request":
                chunks.append(message.data)
                if not message.end_of_stream:
                    if buffered:
                        yield protocol.continue_body("request")
                elif buffered:
                    yield protocol.picked_body(self._endpoint)
                else:
                    yield protocol.picked_headers(self._endpoint)
                    for answer in protocol.echoed_body("request", b"".join(chunks), True):
                        yield answer
            elif isinstance(message, Headers):
                yield protocol.continue_headers("response")
            elif isinstance(message, Body):
                if modes.response == "FULL_DUPLEX_STREAMED":
                    for answer in protocol.echoed_body(
                        "response", message.data, message.end_of_stream
                    ):
                        yield answer
                else:
                    yield protocol.continue_body("response")


async def serve(endpoint: str) -> None:
    server = grpc.aio.server()
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
        NullProcessor(endpoint), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def main() -> None:
    try:  # the event loop `kvgate epp` runs on (uvicorn's choice), where it is installed
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        asyncio.run(serve(sys.argv[1]))
    else:
        uvloop.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()
