"""Small helpers for tests that wait on real servers."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent

Check = Callable[[], bool] | Callable[[], Awaitable[bool]]


async def eventually(check: Check, *, within: float = 10.0, what: str = "condition") -> None:
    """Wait until `check()` is true; fail after `within` seconds (a bound, not a timing claim)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {within} s")
        await asyncio.sleep(0.05)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int = 1) -> list[int]:
    """`count` consecutive loopback TCP ports that are free now, for components that must be
    told their port up front.

    Chosen below the kernel's ephemeral range: the suite's own outgoing connections take
    ephemeral ports, and a port picked there (or next to one) can be taken by the time it
    is bound.
    """
    low, _ = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10_000, max(10_001, low - count))
        probes: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
            return list(range(base, base + count))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def free_port() -> int:
    return free_ports(1)[0]


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run_kvgate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`kvgate ARGS` as users run it: a real process, output captured, never hanging."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextlib.asynccontextmanager
async def kvgate_serve(
    pods: Path, log: Path, env: dict[str, str], *args: str
) -> AsyncIterator[httpx.AsyncClient]:
    """`kvgate serve --pods PODS ARGS` as deployed, its output in `log`: a client to it once
    it is ready; stopped with SIGTERM (killed if it does not stop) when the block ends."""
    port = free_port()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "serve", "--pods", str(pods),
            "--port", str(port), *args,
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            async def ready() -> bool:
                try:
                    return (await client.get("/ready")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, within=30, what="the gateway ready")
            yield client
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await asyncio.wait_for(process.wait(), 10)
