"""Run engines' HTTP apps with uvicorn inside an existing event loop.

`EngineServer` serves one engine (port 0 picks a free port; read `port` after `start()`);
`serve_fleet` runs several until SIGINT/SIGTERM. Uvicorn's own signal capture is disabled
because several servers share one process; the fleet installs one handler for all.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Generator, Sequence

import uvicorn

from simulator.app import create_app
from simulator.engine import SimEngine


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class EngineServer:
    def __init__(self, engine: SimEngine, *, log_level: str = "warning") -> None:
        self.engine = engine
        config = uvicorn.Config(
            create_app(engine),
            host=engine.config.host,
            port=engine.config.port,
            log_level=log_level,
            access_log=False,
            lifespan="on",
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self, start_timeout: float = 10.0) -> None:
        self._task = asyncio.create_task(
            self._server.serve(), name=f"http-{self.engine.config.name}"
        )
        deadline = asyncio.get_running_loop().time() + start_timeout
        while not self._server.started:
            if self._task.done():
                await self._task
                raise RuntimeError(f"engine {self.engine.config.name} failed to start")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(
                    f"engine {self.engine.config.name} did not start in {start_timeout}s"
                )
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        sockets = self._server.servers[0].sockets
        port: int = sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"http://{self.engine.config.host}:{self.port}"

    def request_stop(self) -> None:
        self._server.should_exit = True

    async def stop(self) -> None:
        self.request_stop()
        if self._task is not None:
            await self._task
            self._task = None

    async def wait(self) -> None:
        if self._task is not None:
            await self._task


async def serve_fleet(engines: Sequence[SimEngine], *, log_level: str = "info") -> None:
    """Serve every engine until SIGINT or SIGTERM, then shut them all down."""
    servers = [EngineServer(e, log_level=log_level) for e in engines]
    waiters: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        for server in servers:
            await server.start()
        for server in servers:
            e = server.engine
            print(
                f"sim {e.config.name}: http {server.url} model={e.config.model} "
                f"events={e.publisher.events_endpoint} replay={e.publisher.replay_endpoint} "
                f"flavor={e.config.flavor}",
                flush=True,
            )
        waiters.extend(asyncio.create_task(s.wait()) for s in servers)
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([*waiters, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopper
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for server in servers:
            server.request_stop()
        for server in servers:
            await server.stop()
        await asyncio.gather(*waiters, return_exceptions=True)
