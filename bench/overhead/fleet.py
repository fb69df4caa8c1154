"""The benchmark's child processes: simulated engines, `kvgate serve` (twice: tokenizing at
the engines, and in-process with the simulated model's files), a byte relay and, with
`--peers`, peer routers (`bench/routing/routers.py`).

Each is started on loopback, waited for until ready and stopped on the way out; their CPU
seconds are read from /proc so every phase can say which process saturates. The streaming
phase has a fleet of its own (`stream_fleet`): an engine at real time with the simulator's
decode latency, a gateway and the peers in front of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

import simulator.tokenizer
from bench.harness.fleet import (
    MODEL,
    EngineEndpoint,
    SimOptions,
    SimProcess,
    endpoints_of,
    write_pods_file,
)
from bench.harness.gateway import GatewayProcess
from bench.harness.processes import ChildProcess
from bench.routing.routers import make_router

_START_TIMEOUT_S = 30.0
LOCAL_TOKENIZER = {
    "KVGATE_TOKENIZER": "local",
    "KVGATE_TOKENIZERS": f"{MODEL}={Path(simulator.tokenizer.__file__).parent}",
}
"""The in-process gateway's settings: the simulated model's own tokenizer files."""
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
try:  # the event loop kvgate serves on (uvicorn's choice when installed)
    import uvloop
except ImportError:
    asyncio.run(main())
else:
    uvloop.run(main())
"""


@dataclass
class Fleet:
    engine_urls: list[str]
    gateway_url: str
    relay_url: str
    """A byte relay to the first engine (the process-hop floor)."""
    children: list[ChildProcess]
    peer_urls: dict[str, str] = field(default_factory=dict)
    """Peer routers in front of the engines, by name (their process's name too)."""
    local_gateway_url: str = ""
    """A second gateway, tokenizing in-process (`KVGATE_TOKENIZER=local`); the first one
    asks the engines' /tokenize (`remote`)."""

    def url(self, via: str) -> str:
        if via in self.peer_urls:
            return self.peer_urls[via]
        if via == "gateway-local":
            return self.local_gateway_url
        return self.gateway_url if via == "gateway" else self.relay_url

    def cpu_s(self, name: str) -> float:
        return _cpu(next(c for c in self.children if c.name == name))

    def engines_cpu_s(self) -> float:
        return sum(_cpu(c) for c in self.children if isinstance(c, SimProcess))

    def cpu_by_process(self) -> dict[str, float]:
        return {"client": time.process_time(), **{c.name: _cpu(c) for c in self.children}}


def _cpu(child: ChildProcess) -> float:
    """User + system CPU seconds so far (Linux /proc; 10 ms resolution); NaN if unknown."""
    seconds = child.cpu_seconds()
    return float("nan") if seconds is None else seconds


async def _start_relay(engine_url: str, log: Path, children: list[ChildProcess]) -> str:
    host, _, port = engine_url.removeprefix("http://").partition(":")
    relay = ChildProcess("relay", log)
    children.append(relay)
    await relay.spawn([sys.executable, "-c", _RELAY, host, port], pipe=True)
    line = await asyncio.wait_for(relay.readline(), _START_TIMEOUT_S)
    if not line.strip().isdigit():
        raise RuntimeError(f"the relay did not start: {line!r}")
    relay.follow()
    return f"http://127.0.0.1:{int(line)}"


async def _start_peers(
    peers: Sequence[str],
    pods_file: Path,
    endpoints: list[EngineEndpoint],
    log_dir: Path,
    children: list[ChildProcess],
) -> dict[str, str]:
    """Peer routers in front of `endpoints`, ready (workers registered); their URLs."""
    urls: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=5.0) as client:
        for name in peers:
            router = make_router(name, pods_file, endpoints, log_dir, random.Random())
            children.append(router)
            await router.start()
            await router.wait_ready(client, timeout_s=60.0)
            urls[name] = router.url
    return urls


def running_fleet(
    engines: int, workdir: Path, profile: Path | None, peers: Sequence[str] = ()
) -> contextlib.AbstractAsyncContextManager[Fleet]:
    """Engines, then a gateway, a byte relay (and `peers`) in front of them."""
    options = SimOptions(time_scale=1_000_000, max_batch=256, max_model_len=None)
    log = workdir / "processes.log"
    sims = [
        SimProcess(options, log, name=f"bench-{i}", label=f"engine-{i}") for i in range(engines)
    ]
    return _fleet(workdir, "", sims, "gateway", profile, peers, relay=True)


def stream_fleet(
    workdir: Path, decode_ms: tuple[float, float], peers: Sequence[str] = ()
) -> contextlib.AbstractAsyncContextManager[Fleet]:
    """One engine at real time (`decode_ms`: the simulator's `--decode-ms-per-token` and
    `--decode-ms-per-seq`), a gateway (its default policy) and `peers` in front of it."""
    per_token, per_seq = decode_ms
    extra = ("--decode-ms-per-token", f"{per_token:g}", "--decode-ms-per-seq", f"{per_seq:g}")
    options = SimOptions(max_batch=256, max_model_len=None, extra=extra)
    sim = SimProcess(options, workdir / "stream-processes.log", name="stream-0", label="engine")
    return _fleet(workdir, "stream-", [sim], "kvgate", None, peers, relay=False)


@contextlib.asynccontextmanager
async def _fleet(
    workdir: Path,
    prefix: str,
    engines: list[SimProcess],
    gateway_name: str,
    profile: Path | None,
    peers: Sequence[str],
    *,
    relay: bool,
) -> AsyncIterator[Fleet]:
    """`engines` started, then the rest; every process is stopped on the way out, also on
    errors and Ctrl-C."""
    children: list[ChildProcess] = list(engines)
    log = workdir / f"{prefix}processes.log"
    try:
        for engine in engines:
            await engine.start(timeout_s=_START_TIMEOUT_S)
        endpoints = endpoints_of(engines)
        pods_file = write_pods_file(workdir / f"{prefix}pods.json", endpoints)
        gateway = GatewayProcess(pods_file, log, profile=profile, name=gateway_name,
                                 env={"KVGATE_TOKENIZER": "remote"})  # fmt: skip
        children.append(gateway)
        await gateway.start(_START_TIMEOUT_S)
        local_url = ""
        if relay:  # the measured fleet (not the streaming one): both tokenizers side by side
            local = GatewayProcess(pods_file, log, name="gateway-local", env=LOCAL_TOKENIZER)
            children.append(local)
            await local.start(_START_TIMEOUT_S)
            local_url = local.url
        relay_url = await _start_relay(endpoints[0].url, log, children) if relay else ""
        peer_dir = workdir / f"{prefix}peers"
        peer_urls = await _start_peers(peers, pods_file, endpoints, peer_dir, children)
        yield Fleet([e.url for e in endpoints], gateway.url, relay_url, children, peer_urls,
                    local_url)  # fmt: skip
    finally:
        for child in reversed(children):
            await child.stop(15.0)
