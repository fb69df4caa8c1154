"""Simulated engines (`python -m simulator`) as child processes, and their addresses.

A `SimProcess` is one engine, or `--fleet N` engines in one process. Each prints
`sim NAME: http URL model=M events=E replay=R` once it listens; those lines are its
endpoints. On free ports (the default) a start that loses a port race is tried again on
others; on a fixed port (`port=P`: HTTP P, events P+1, replay P+2) every restart binds
the same addresses, as a restarted pod keeps its Service address.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.ports import free_port_block
from bench.harness.processes import ChildProcess
from bench.harness.readiness import StartError, wait_http

MODEL = "sim-model"
"""The simulator's default served model name."""
_LINE = re.compile(r"^sim (\S+): http (\S+) model=(\S+) events=(\S+) replay=(\S+)")


@dataclass(frozen=True, slots=True)
class EngineEndpoint:
    name: str
    url: str
    model: str
    events: str
    replay: str


@dataclass(frozen=True, slots=True)
class SimOptions:
    """The simulator's flags the benchmarks set; None leaves the simulator's default."""

    gpu_blocks: int | None = None
    time_scale: float | None = None
    max_batch: int | None = None
    max_model_len: int | None = 32768
    replay_buffer: int | None = None
    seed: int | None = None
    extra: tuple[str, ...] = ()
    """Further flags as they are (`--flavor sglang`, a latency model, …)."""

    def args(self, seed_offset: int = 0) -> list[str]:
        flags = {
            "--replay-buffer": self.replay_buffer,
            "--gpu-blocks": self.gpu_blocks,
            "--time-scale": self.time_scale,
            "--max-batch": self.max_batch,
            "--max-model-len": self.max_model_len,
            "--seed": None if self.seed is None else self.seed + seed_offset,
        }
        args = [part for flag, v in flags.items() if v is not None for part in (flag, str(v))]
        return [*args, *self.extra]


class SimProcess(ChildProcess):
    """Start with `await start()`, read `endpoints`, end with `await stop()`."""

    def __init__(
        self,
        options: SimOptions,
        log_path: Path,
        *,
        fleet: int | None = None,
        name: str | None = None,
        port: int = 0,
        label: str | None = None,
    ) -> None:
        """`fleet`: N engines in this process (`--fleet N` on free ports), else one engine
        on `port` (0: any free port); `name`: the engines' (`--name`); `label`: the
        process's, in messages (default: `name`)."""
        super().__init__(label or name or "engines", log_path)
        self.options = options
        self.fleet = fleet
        self.engine_name = name
        self.port = port
        self.endpoints: list[EngineEndpoint] = []

    def command(self, port: int) -> list[str]:
        fixed = self.fleet is None and port != 0
        events, replay = (
            (f"tcp://127.0.0.1:{port + 1}", f"tcp://127.0.0.1:{port + 2}")
            if fixed
            else ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
        )
        where = ["--port", str(port)] if self.fleet is None else [
            "--fleet", str(self.fleet), "--base-port", str(port)]  # fmt: skip
        name = ["--name", self.engine_name] if self.engine_name else []
        # A restart on fixed ports draws new randomness, as a restarted engine would.
        seeds = self.starts if fixed else 0
        zmq = ["--events", events, "--replay", replay]
        options = self.options.args(seeds)
        return [sys.executable, "-m", "simulator", *where, *name, *zmq, *options,
                "--log-level", "warning"]  # fmt: skip

    async def start(self, rng: random.Random | None = None, timeout_s: float = 30.0) -> None:
        if self.fleet is None:
            await self._start_once(self.port, timeout_s)
            return
        rng = rng or random.Random()
        for attempt in range(3):  # a port taken between the check and the bind: try others
            try:
                await self._start_once(free_port_block(self.fleet, rng), timeout_s)
                return
            except StartError:
                await self.stop()
                if attempt == 2:
                    raise

    @property
    def endpoint(self) -> EngineEndpoint:
        """The (first) engine's addresses, kept while it is down between restarts."""
        return self.endpoints[0]

    async def _start_once(self, port: int, timeout_s: float) -> None:
        await self.spawn(self.command(port), pipe=True)
        endpoints: list[EngineEndpoint] = []
        try:
            async with asyncio.timeout(timeout_s):
                while len(endpoints) < (self.fleet or 1):
                    line = await self.readline()
                    if not line:
                        raise StartError(f"the engine process exited: {self.log_tail(20)}")
                    if match := _LINE.match(line):
                        endpoints.append(EngineEndpoint(*match.groups()))
        except TimeoutError as exc:
            raise StartError(f"engines not up after {timeout_s} s: {self.log_tail(20)}") from exc
        self.endpoints = endpoints
        self.follow()
        for endpoint in self.endpoints:
            await wait_http(f"{endpoint.url}/health", self, timeout_s=timeout_s)

    def cpu_total(self) -> float:
        """CPU seconds (user + system) the engines used so far; 0 when unknown."""
        return self.cpu_seconds() or 0.0


async def start_all(engines: Sequence[SimProcess], rng: random.Random) -> None:
    """Start engine processes one at a time (each picks free ports after the previous one
    bound its own); all stopped again if one fails."""
    try:
        for engine in engines:
            await engine.start(rng)
    except BaseException:
        await asyncio.gather(*(engine.stop() for engine in engines))
        raise


async def warm_up(
    client: httpx.AsyncClient, endpoints: Sequence[EngineEndpoint], requests: int = 3
) -> None:
    """A few short streamed requests straight to every engine, before any router runs. A
    process's first requests are slower than its later ones (first allocations and code
    paths), and a workload's routers run one after the other on the same engines: without
    this the first router alone pays for them, and a cost model learns its pods' speeds
    from them (it ran 3–5 % slower at TTFT p90 than an identical router after it)."""

    async def one(endpoint: EngineEndpoint, index: int) -> None:
        body = {"model": endpoint.model, "prompt": f"warm-up {index} " * 64, "max_tokens": 2,
                "stream": True}  # fmt: skip
        async with client.stream("POST", f"{endpoint.url}/v1/completions", json=body) as answer:
            answer.raise_for_status()
            async for _ in answer.aiter_bytes():
                pass

    for index in range(requests):
        await asyncio.gather(*(one(endpoint, index) for endpoint in endpoints))


def endpoints_of(engines: Sequence[SimProcess]) -> list[EngineEndpoint]:
    return [endpoint for engine in engines for endpoint in engine.endpoints]


def write_pods_file(
    path: Path, endpoints: Sequence[EngineEndpoint], topic: str = "kv-events"
) -> Path:
    """The gateway's static pods file (`kvgate serve --pods`) for these engines."""
    pods = [
        {"name": e.name, "url": e.url, "model": e.model, "events": e.events,
         "replay": e.replay, "topic": topic}
        for e in endpoints
    ]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pods": pods}, indent=2) + "\n")
    return path
