"""The picker's gRPC server: Envoy's `ExternalProcessor` service and the standard gRPC
health service, on one port, started once the gateway is (its lifespan's exit stack stops
it first: no new stream, streams in progress given `GRACE_S`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.epp import protocol
from gateway.epp.picker import Picker
from gateway.epp.protocol import Pb
from gateway.epp.stream import PickStream, StreamError
from gateway.errors import RequestTimeout, TooManyRequests
from gateway.http.api import readiness
from gateway.state import GatewayState

logger = logging.getLogger(__name__)

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
GRACE_S = 5.0
HEALTH_INTERVAL_S = 0.25
_MESSAGE_MARGIN = 64 * 1024
"""Bytes a single ext_proc message may carry beyond the body limit (headers, metadata)."""


@dataclass(frozen=True, slots=True)
class EppConfig:
    host: str | None = None
    """None: the gateway's own (`KVGATE_HOST`)."""
    port: int = 9002
    """The Inference Extension's picker port; 0: a free one (tests)."""
    cert: Path | None = None
    key: Path | None = None
    """TLS certificate chain and key (PEM); both or neither (plaintext)."""
    client_ca: Path | None = None
    """With TLS: only clients presenting a certificate this CA bundle (PEM) signed."""


class _Processor:
    """`ExternalProcessor.Process`: one stream per HTTP request, bounded as the proxy bounds
    a request: at most `KVGATE_MAX_CONCURRENT_REQUESTS` streams (a 429 beyond), the whole
    body within `KVGATE_BODY_TIMEOUT` of the stream's start (a 408), and once picked, each
    next message of the answer within `KVGATE_UPSTREAM_TIMEOUT` (then the booking is
    released as a 504 and the stream ends with DEADLINE_EXCEEDED)."""

    def __init__(self, picker: Picker) -> None:
        self._picker = picker
        self._active = 0
        settings = picker.gateway.settings
        self._limit = settings.max_concurrent_requests
        self._body_timeout_s = settings.body_timeout_s
        self._answer_timeout_s = settings.upstream_timeout_s

    @property
    def active(self) -> int:
        """Streams in progress."""
        return self._active

    async def Process(  # noqa: N802  # the gRPC method's name
        self, requests: AsyncIterator[Pb], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Pb]:
        stream = PickStream(self._picker, _peer_host(context.peer()))
        metrics = self._picker.gateway.metrics
        incoming = aiter(requests)
        deadline = asyncio.get_running_loop().time() + self._body_timeout_s
        self._active += 1
        try:
            while not stream.finished:
                try:
                    async with asyncio.timeout(self._wait(stream, deadline)):
                        request = await anext(incoming)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if stream.picked:  # the answer stalled: as the proxy's upstream timeout
                        stream.stalled()
                        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, _STALLED_MESSAGE)
                    for answer in stream.refuse(RequestTimeout(_BODY_TIMEOUT_MESSAGE)):
                        yield answer
                    return
                if not stream.started and self._active > self._limit:
                    limit = self._limit
                    for answer in stream.refuse(TooManyRequests(_busy(limit), retry_after_s=1)):
                        yield answer
                    return
                try:
                    answers = await stream.handle(protocol.read(request))
                except protocol.Malformed as exc:
                    metrics.epp.stream_errors.labels("INVALID_ARGUMENT").inc()
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                except StreamError as exc:
                    metrics.epp.stream_errors.labels(exc.code).inc()
                    await context.abort(getattr(grpc.StatusCode, exc.code), exc.details)
                for answer in answers:
                    yield answer
        finally:
            self._active -= 1
            stream.close()

    def _wait(self, stream: PickStream, deadline: float) -> float:
        """How long the next message may take: the answer's next message once picked,
        else what is left of the body's time."""
        if stream.picked:
            return self._answer_timeout_s
        return max(0.0, deadline - asyncio.get_running_loop().time())


_STALLED_MESSAGE = "no message of the answer within KVGATE_UPSTREAM_TIMEOUT"
_BODY_TIMEOUT_MESSAGE = "the request did not arrive whole within KVGATE_BODY_TIMEOUT"


def _busy(limit: int) -> str:
    return f"the gateway is at its limit of {limit} requests in progress; retry later"


def _peer_host(peer: str) -> str:
    """`ipv4:10.0.0.1:5000` / `ipv6:[::1]:5000` → the address."""
    _, _, address = peer.partition(":")
    return address.rpartition(":")[0].strip("[]") or address


class EppService:
    """The gRPC server of `kvgate epp`; `start` is `create_app`'s `attach` hook. `port` is
    the bound port once started."""

    def __init__(self, config: EppConfig) -> None:
        self.config = config
        self.port = 0
        self.processor: _Processor | None = None

    async def start(self, gateway: GatewayState, stack: contextlib.AsyncExitStack) -> None:
        limit = gateway.settings.max_body_bytes + _MESSAGE_MARGIN
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit)])
        self.processor = _Processor(Picker(gateway))
        external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(self.processor, server)
        checks = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(checks, server)
        host = self.config.host or gateway.settings.host
        self.port = self._bind(server, host)
        await server.start()
        stack.push_async_callback(server.stop, GRACE_S)
        task = asyncio.create_task(_report_health(gateway, checks), name="kvgate-epp-health")
        stack.push_async_callback(_cancel, task)
        transport = "plaintext" if self.config.cert is None else "TLS"
        if self.config.client_ca is not None:
            transport = "mutual TLS"
        logger.info("kvgate endpoint picker serving ext_proc on %s:%d (%s)", host, self.port,
                    transport)  # fmt: skip

    def _bind(self, server: grpc.aio.Server, host: str) -> int:
        config = self.config
        address = f"[{host}]:{config.port}" if ":" in host else f"{host}:{config.port}"
        if config.cert is None or config.key is None:
            port: int = server.add_insecure_port(address)
            return port
        pair = (config.key.read_bytes(), config.cert.read_bytes())
        ca = None if config.client_ca is None else config.client_ca.read_bytes()
        credentials = grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )
        port = server.add_secure_port(address, credentials)
        return port


def routable(gateway: GatewayState) -> bool:
    """SERVING: the gateway is ready (`/ready`) and some pod is routable."""
    return readiness(gateway)[0] and bool(gateway.registry.routable())


async def _report_health(gateway: GatewayState, checks: health.aio.HealthServicer) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    await checks.set("liveness", serving)
    while True:
        status = serving if routable(gateway) else not_serving
        for service in ("", SERVICE, "readiness"):
            await checks.set(service, status)
        await asyncio.sleep(HEALTH_INTERVAL_S)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
