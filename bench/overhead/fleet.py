"""The benchmark's child processes: simulated engines, `kvgate serve`, a byte relay.

Each is started on loopback, waited for until ready and stopped on the way out; their CPU
seconds are read from /proc so every phase can say which process saturates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

MODEL = "sim-model"
_READY = re.compile(r"http (?P<url>http://\S+) .*events=(?P<events>\S+) replay=(?P<replay>\S+)")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_START_TIMEOUT_S = 30.0
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

# A byte relay (no HTTP parsing) in its own process: the cost of one more process hop on
# this machine, the floor under any proxy's added latency.
_RELAY = """
import asyncio, sys
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
async def handle(client_reader, client_writer):
    engine_reader, engine_writer = await asyncio.open_connection(sys.argv[1], int(sys.argv[2]))
    await asyncio.gather(pipe(client_reader, engine_writer), pipe(engine_reader, client_writer),
                         return_exceptions=True)
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


@dataclass
class Child:
    """A process this benchmark started; `stop()` ends it (`stop_signal`, then SIGKILL)."""

    name: str
    proc: asyncio.subprocess.Process
    stop_signal: int = signal.SIGTERM

    def cpu_s(self) -> float:
        """User + system CPU seconds so far (Linux /proc; 10 ms resolution)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return float("nan")
        fields = stat.rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    async def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(self.stop_signal)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()


@dataclass
class Fleet:
    engine_urls: list[str]
    gateway_url: str
    relay_url: str
    """A byte relay to the first engine (the process-hop floor)."""
    children: list[Child]

    def url(self, via: str) -> str:
        return self.gateway_url if via == "gateway" else self.relay_url

    def cpu_s(self, name: str) -> float:
        return next(c for c in self.children if c.name == name).cpu_s()

    def cpu_by_process(self) -> dict[str, float]:
        return {"client": time.process_time(), **{c.name: c.cpu_s() for c in self.children}}


async def _start_engine(index: int, log: Path, children: list[Child]) -> dict[str, str]:
    cmd = [
        sys.executable, "-m", "simulator", "--name", f"bench-{index}", "--port", "0",
        "--events", "tcp://127.0.0.1:0", "--replay", "tcp://127.0.0.1:0",
        "--time-scale", "1000000", "--max-batch", "256", "--log-level", "warning",
    ]  # fmt: skip
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    children.append(Child(f"engine-{index}", proc))
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S)).decode()
    match = _READY.search(line)
    if match is None:
        raise RuntimeError(f"simulated engine {index} did not start: {line!r}")
    return {"name": f"bench-{index}", "topic": "kv-events", "model": MODEL, **match.groupdict()}


def _free_port(rng: random.Random) -> int:
    """A port below the ephemeral range that binds now (`kvgate serve` needs a fixed one)."""
    for _ in range(200):
        port = rng.randrange(20_000, 32_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found in 20000-32000")


async def _start_gateway(
    pods_file: Path, log: Path, profile: Path | None, children: list[Child]
) -> str:
    """`kvgate serve` on a free port; tried again on another port if that one was taken."""
    rng = random.Random()
    head = ["-c", _PROFILED, str(profile)] if profile else ["-m", "gateway.cli"]
    for _ in range(3):
        port = _free_port(rng)
        cmd = [sys.executable, *head, "serve", "--pods", str(pods_file), "--port", str(port),
               "--log-level", "warning"]  # fmt: skip
        with log.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(*cmd, stdout=out, stderr=out)
        child = Child("gateway", proc, signal.SIGINT)  # uvicorn drains; cProfile writes
        children.append(child)
        url = f"http://127.0.0.1:{port}"
        if await _wait_ready(url, proc):
            return url
        await child.stop()
        children.remove(child)
        text = await asyncio.to_thread(log.read_text)
        if "address already in use" not in text.lower():
            raise RuntimeError(f"the gateway did not start; its log:\n{text[-2000:]}")
    raise RuntimeError("the gateway found no free port in 3 attempts")


async def _start_relay(engine_url: str, log: Path, children: list[Child]) -> str:
    host, _, port = engine_url.removeprefix("http://").partition(":")
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _RELAY, host, port, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    children.append(Child("relay", proc))
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S)
    if not line.strip().isdigit():
        raise RuntimeError(f"the relay did not start: {line!r}")
    return f"http://127.0.0.1:{int(line)}"


async def _wait_ready(url: str, proc: asyncio.subprocess.Process) -> bool:
    deadline = time.monotonic() + _START_TIMEOUT_S
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline and proc.returncode is None:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/ready")).status_code == 200:
                    return True
            await asyncio.sleep(0.1)
    return False


@contextlib.asynccontextmanager
async def running_fleet(engines: int, workdir: Path, profile: Path | None) -> AsyncIterator[Fleet]:
    """Engines, then a gateway in front of them; every process is stopped on the way out,
    also on errors and Ctrl-C."""
    children: list[Child] = []
    try:
        log = workdir / "processes.log"
        pods = [await _start_engine(i, log, children) for i in range(engines)]
        pods_file = workdir / "pods.json"
        pods_file.write_text(json.dumps({"pods": pods}))
        gateway_url = await _start_gateway(pods_file, log, profile, children)
        relay_url = await _start_relay(pods[0]["url"], log, children)
        yield Fleet([p["url"] for p in pods], gateway_url, relay_url, children)
    finally:
        for child in reversed(children):
            await child.stop()
