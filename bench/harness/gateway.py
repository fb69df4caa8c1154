"""The gateway under test: `kvgate serve` as a child process (or in this process), its
readiness, and the admin calls the benchmarks wait on."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bench.harness.ports import choose_port, free_port_block
from bench.harness.processes import ChildProcess
from bench.harness.readiness import StartError, wait_http

if TYPE_CHECKING:
    from gateway.http.server import GatewayServer
    from gateway.settings import Settings

# `kvgate serve` under cProfile with a CPU-time clock: time spent waiting for a core (other
# processes run) is then not charged to whichever call was running when preempted.
_PROFILED = """
import cProfile, sys, time
from gateway.cli import main
path, sys.argv = sys.argv[1], [sys.argv[0], *sys.argv[2:]]
profiler = cProfile.Profile(time.process_time)
try:
    profiler.runcall(main)
finally:
    profiler.dump_stats(path)
"""


def serve_command(
    pods_file: Path, port: int, policy: str | None = None, profile: Path | None = None
) -> list[str]:
    """`kvgate serve` (under cProfile when `profile` names where its stats go)."""
    head = ["-c", _PROFILED, str(profile)] if profile else ["-m", "gateway.cli"]
    policy_flag = ["--policy", policy] if policy else []
    return [sys.executable, *head, "serve", "--pods", str(pods_file), "--port", str(port),
            *policy_flag, "--log-level", "warning"]  # fmt: skip


class GatewayProcess(ChildProcess):
    """`kvgate serve --pods FILE --port P [--policy NAME]`, ready when GET `ready_path`
    answers 200. Stopped with SIGINT: uvicorn drains, the lifespan stops everything (and
    cProfile, with `profile`, writes its stats).

    `port` 0: a free port, tried again on another one if it was taken meanwhile; a fixed
    port is kept across restarts (`kill()` then `start()` again).
    """

    def __init__(
        self,
        pods_file: Path,
        log_path: Path,
        *,
        port: int = 0,
        policy: str | None = None,
        admin_token: str | None = None,
        env: dict[str, str] | None = None,
        profile: Path | None = None,
        ready_path: str = "/ready",
        name: str = "gateway",
    ) -> None:
        super().__init__(name, log_path, stop_signal=signal.SIGINT)
        self.pods_file = pods_file
        self.port = port
        self.policy = policy
        self.admin_token = admin_token
        self.env = dict(env or {})
        if admin_token is not None:
            self.env["KVGATE_ADMIN_TOKEN"] = admin_token
        self.profile = profile
        self.ready_path = ready_path
        self._fixed = port != 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return serve_command(self.pods_file, self.port, self.policy, self.profile)

    async def start(self, timeout_s: float = 30.0) -> None:
        """Spawn and wait until ready."""
        await self.spawn_only()
        await self.wait_ready(timeout_s)

    async def spawn_only(self) -> None:
        if not self._fixed:
            self.port = free_port_block(1, random.Random())
        await self.spawn(self.command(), env=self.env)

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        for _ in range(3):
            try:
                await wait_http(f"{self.url}{self.ready_path}", self, timeout_s=timeout_s)
                return
            except StartError:
                taken = "address already in use" in self.log_tail(40).lower()
                if self._fixed or not taken:
                    raise
            await self.stop()
            self.port = free_port_block(1, random.Random())
            await self.spawn(self.command(), env=self.env)
        raise StartError("the gateway found no free port in 3 attempts")

    def admin(self, client: httpx.AsyncClient) -> AdminClient:
        assert self.admin_token is not None
        return AdminClient(client, self.url, self.admin_token)


async def serve_in_process(settings: Settings, port: int = 0) -> GatewayServer:
    """The gateway in this process (uvicorn on this loop) on `port` when it is free, else
    on any free port (read `server.port`)."""
    from gateway.app import create_app  # not for every benchmark process: it is heavy
    from gateway.http.server import GatewayServer

    server = GatewayServer(create_app(settings), port=choose_port(port), drain_timeout_s=2)
    await server.start()
    return server


class AdminClient:
    """The gateway's admin API over one HTTP client."""

    def __init__(self, client: httpx.AsyncClient, gateway_url: str, token: str) -> None:
        self.client = client
        self._url = gateway_url
        self.headers = {"authorization": f"Bearer {token}"}

    async def get(self, path: str, **params: str) -> Any:
        """GET an admin `path`; its JSON answer."""
        response = await self.client.get(self._url + path, params=params, headers=self.headers)
        response.raise_for_status()
        return response.json()

    async def pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = (await self.get("/admin/pods"))["pods"]
        return pods

    async def wait_whole(self, *, empty: bool = False, timeout_s: float = 30.0) -> None:
        """Until every pod is healthy and its subscriber live and whole (and, with `empty`,
        its index holds no block)."""
        last: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        last = await self.pods()
                        if last and all(_settled(pod, empty) for pod in last):
                            return
                    await asyncio.sleep(0.05)
        except TimeoutError as exc:
            states = {p["name"]: (p.get("subscriber"), p.get("index_blocks")) for p in last}
            raise TimeoutError(f"subscribers not whole after {timeout_s} s: {states}") from exc


def _settled(pod: dict[str, Any], empty: bool) -> bool:
    subscriber = pod.get("subscriber") or {}
    whole = bool(pod.get("healthy")) and subscriber.get("phase") == "live"
    whole = whole and bool(subscriber.get("whole"))
    return whole and (not empty or pod.get("index_blocks", 0) == 0)
