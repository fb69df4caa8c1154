"""The simulated engines, as one `python -m simulator --fleet N` child process.

The child runs in its own session (process group), so a Ctrl-C in the terminal reaches the
demo only and the demo stops things in order (gateway first, then engines); `stop()` ends
the whole group (SIGTERM, then SIGKILL after a grace period). On Linux the child also gets
SIGTERM if the demo dies without cleaning up (`PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from bench.processes import die_with_parent, log_tail, stop_group

_LINE = re.compile(r"^sim (\S+): http (\S+) model=(\S+) events=(\S+) replay=(\S+)")
_PORT_LOW, _PORT_HIGH = 20_000, 32_000  # below the ephemeral range (32768+)


@dataclass(frozen=True, slots=True)
class EngineEndpoint:
    name: str
    url: str
    model: str
    events: str
    replay: str


@dataclass(frozen=True, slots=True)
class FleetSpec:
    engines: int
    gpu_blocks: int
    time_scale: float
    max_batch: int = 32
    seed: int = 0


class FleetError(RuntimeError):
    """The engine process failed to start (its log is in the message)."""


def free_port_block(count: int, rng: random.Random, *, attempts: int = 50) -> int:
    """A base port such that `base .. base+count-1` are free on loopback right now."""
    for _ in range(attempts):
        base = rng.randrange(_PORT_LOW, _PORT_HIGH - count)
        if all(port_is_free(base + i) for i in range(count)):
            return base
    raise FleetError(f"no {count} consecutive free ports found in {_PORT_LOW}..{_PORT_HIGH}")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class SimFleet:
    """Start with `await start()`, read `endpoints` and `pid`, end with `await stop()`."""

    def __init__(self, spec: FleetSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.endpoints: list[EngineEndpoint] = []
        self._process: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the engine process used so far; 0 when unknown."""
        if self._process is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self._process.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def command(self, base_port: int) -> list[str]:
        spec = self.spec
        return [
            sys.executable, "-m", "simulator",
            "--fleet", str(spec.engines), "--base-port", str(base_port),
            "--events", "tcp://127.0.0.1:0", "--replay", "tcp://127.0.0.1:0",
            "--gpu-blocks", str(spec.gpu_blocks), "--time-scale", str(spec.time_scale),
            "--max-batch", str(spec.max_batch), "--max-model-len", "32768",
            "--seed", str(spec.seed), "--log-level", "warning",
        ]  # fmt: skip

    async def start(self, rng: random.Random, timeout_s: float = 30.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        last_error: FleetError | None = None
        for _ in range(3):  # a port taken between the check and the bind: try other ports
            try:
                await self._start_once(free_port_block(self.spec.engines, rng), timeout_s)
                return
            except FleetError as exc:
                last_error = exc
                await self.stop()
        assert last_error is not None
        raise last_error

    async def _start_once(self, base_port: int, timeout_s: float) -> None:
        self._log = self.log_path.open("ab")
        self._process = await asyncio.create_subprocess_exec(
            *self.command(base_port),
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        stdout = self._process.stdout
        assert stdout is not None
        try:
            async with asyncio.timeout(timeout_s):
                while len(self.endpoints) < self.spec.engines:
                    line = await stdout.readline()
                    if not line:
                        raise FleetError(f"the engine process exited: {self._log_tail()}")
                    match = _LINE.match(line.decode(errors="replace"))
                    if match:
                        self.endpoints.append(EngineEndpoint(*match.groups()))
        except TimeoutError as exc:
            raise FleetError(f"engines not up after {timeout_s} s: {self._log_tail()}") from exc
        self._drain = asyncio.create_task(self._drain_stdout(stdout), name="demo-sim-stdout")
        await self.wait_healthy(timeout_s)

    async def _drain_stdout(self, stream: asyncio.StreamReader) -> None:
        while await stream.readline():
            pass

    async def wait_healthy(self, timeout_s: float) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client, asyncio.timeout(timeout_s):
            for endpoint in self.endpoints:
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"{endpoint.url}/health")).status_code == 200:
                            break
                    await asyncio.sleep(0.05)

    def _log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    async def stop(self, grace_s: float = 5.0) -> None:
        """End the engine process group; idempotent."""
        process, self._process = self._process, None
        if process is not None:
            await stop_group(process, grace_s)
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            self._drain = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self.endpoints = []


def engine_urls(endpoints: Sequence[EngineEndpoint]) -> list[str]:
    return [endpoint.url for endpoint in endpoints]
