"""Running the gateway app with uvicorn inside an existing event loop (demo, benchmarks,
tests); `kvgate serve` runs uvicorn itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp

from gateway.http.protocol import BoundedHttpToolsProtocol, bounded_protocol


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the embedding program owns the signals


class GatewayServer:
    """Serve `app` on `host:port` (port 0: a free one; read `port` after `start()`)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        drain_timeout_s: int = 5,
        max_header_bytes: int = BoundedHttpToolsProtocol.max_header_bytes,
        header_timeout_s: float = BoundedHttpToolsProtocol.header_timeout_s,
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=drain_timeout_s,
            proxy_headers=False,  # the client address: KVGATE_TRUSTED_PROXIES only
            http=bounded_protocol(
                max_header_bytes=max_header_bytes, header_timeout_s=header_timeout_s
            ),
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None
        self.host = host

    async def start(self, timeout_s: float = 30.0) -> None:
        self._task = asyncio.create_task(self._server.serve(), name="kvgate-gateway-http")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("the gateway failed to start (see its log)")
            if loop.time() > deadline:
                raise TimeoutError(f"the gateway did not start within {timeout_s} s")
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        port: int = self._server.servers[0].sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
            self._task = None
