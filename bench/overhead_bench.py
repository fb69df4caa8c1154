"""`kvgate bench overhead`: what the gateway adds to calling the engine directly.

Three kinds of process on loopback: simulated engines (`python -m simulator`, huge
`--time-scale`, one generated token, so the engine is fast), one gateway (`kvgate serve`,
the product as users run it) and the load generator (this process). Every figure compares
the same requests sent by the same client over keep-alive connections, directly to the
engine and through the gateway:

- added latency p50/p99 (gateway percentile minus direct percentile) at concurrency 1
  (direct and gateway requests alternate) and 32 (alternating blocks, closed loop), for
  `round-robin` (no tokenization) and `prefix-cache` (tokenize + match) with a repeated
  prompt (the gateway's tokenizer cache hits) and with distinct prompts (one /tokenize each);
- the same at concurrency 1 through a byte relay process (`c1_relay`): what one more process
  hop costs on this machine, the floor under any proxy's added latency;
- streaming: time from sending the request to the first SSE chunk, direct and via the gateway;
- max requests/s: closed loop, 64 in flight, small non-streamed round-robin requests.

CPU seconds of every process are read from /proc, so each phase also reports the gateway's
CPU per request and which process saturates. The load generator is a minimal keep-alive
HTTP/1.1 client on asyncio streams (`--client raw`, ~0.1 ms of CPU per request); an
httpx.AsyncClient (`--client httpx`) costs ~1 ms per request at concurrency 1 and ~5 ms at
64 (its connection pool scans every connection on each request), so it would measure itself.
`--profile-gateway PATH` runs the gateway under cProfile with a CPU-time clock (the figures
then include the profiler's overhead) and prints where its CPU goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import pstats
import random
import re
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx

from bench.results_io import add_output_arguments, percentile, print_table, pyplot, write_json

MODEL = "sim-model"
PATH = "/v1/completions"
TARGETS = {
    "added_p50_ms_c1": ("<=", 1.0),
    "max_rps_gateway": (">=", 1000.0),
    "stream_first_chunk_added_p50_ms": ("<=", 2.0),
}
WARM_UP = 10
_PROMPT = "You are a helpful assistant. Say hello to the user in one short word please."
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


# --------------------------------------------------------------------------- processes


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


# --------------------------------------------------------------------------- clients


@dataclass(frozen=True, slots=True)
class Timing:
    first_s: float
    """Request sent → first body bytes (the first SSE chunk of a stream)."""
    total_s: float
    status: int


class Channel(Protocol):
    """Sequential requests to one server over one keep-alive connection."""

    async def post(self, body: bytes, policy: str) -> Timing: ...

    async def close(self) -> None: ...


ChannelFactory = Callable[[str], Channel]


class RawChannel:
    """A minimal HTTP/1.1 keep-alive client (content-length and chunked bodies)."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self._host, self._port = host, int(port)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes, policy: str) -> Timing:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        head = (
            f"POST {PATH} HTTP/1.1\r\nhost: {self._host}:{self._port}\r\n"
            f"content-type: application/json\r\nx-kvgate-policy: {policy}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        started = time.perf_counter()
        self._writer.write(head + body)
        status, first = await _read_response(self._reader)
        return Timing(first - started, time.perf_counter() - started, status)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, float]:
    """Reads one response; returns its status and when its first body bytes arrived."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
        return status, time.perf_counter()
    first = 0.0
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        await reader.readexactly(size + 2)
        first = first or time.perf_counter()
    await reader.readuntil(b"\r\n")
    return status, first or time.perf_counter()


class HttpxChannel:
    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self._client = client
        self._url = url + PATH

    async def post(self, body: bytes, policy: str) -> Timing:
        headers = {"content-type": "application/json", "x-kvgate-policy": policy}
        started = time.perf_counter()
        first = 0.0
        async with self._client.stream("POST", self._url, content=body, headers=headers) as r:
            async for _ in r.aiter_raw():
                first = first or time.perf_counter()
        ended = time.perf_counter()
        return Timing((first or ended) - started, ended - started, r.status_code)

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def client_factory(kind: str) -> AsyncIterator[ChannelFactory]:
    if kind == "raw":
        yield RawChannel
        return
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
        yield lambda url: HttpxChannel(client, url)


# --------------------------------------------------------------------------- load


@dataclass(frozen=True)
class Case:
    """One comparison: the same kind of request, direct and through the gateway."""

    key: str
    """Suffix of the JSON keys (`added_p50_ms_<key>`)."""
    policy: str
    concurrency: int
    requests: int
    distinct: bool = False
    stream: bool = False
    via: str = "gateway"
    """Through the gateway, or through the byte relay ("relay")."""


@dataclass
class Bodies:
    """Request bodies; distinct prompts never repeat, across sides and cases."""

    counter: Iterator[int] = field(default_factory=itertools.count)

    def next(self, case: Case) -> bytes:
        prompt = f"Request {next(self.counter)}. {_PROMPT}" if case.distinct else _PROMPT
        body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        if case.stream:
            body.update(max_tokens=4, stream=True)
        return json.dumps(body).encode()


@dataclass
class Comparison:
    direct: list[Timing] = field(default_factory=list)
    gateway: list[Timing] = field(default_factory=list)
    gateway_cpu_s: float = 0.0
    """CPU the gateway process used while its measured requests ran."""

    @property
    def errors(self) -> int:
        return sum(t.status != 200 for t in (*self.direct, *self.gateway))


async def compare_c1(case: Case, fleet: Fleet, new: ChannelFactory, bodies: Bodies) -> Comparison:
    """Direct and gateway requests alternate one by one, so drift affects both alike."""
    urls = fleet.engine_urls[:1] if case.via == "relay" else fleet.engine_urls
    engines = [new(url) for url in urls]
    gateway = new(fleet.url(case.via))
    result = Comparison()
    cpu_before = 0.0
    try:
        for i in range(case.requests + WARM_UP):
            if i == WARM_UP:
                cpu_before = fleet.cpu_s(case.via)
            direct = await engines[i % len(engines)].post(bodies.next(case), case.policy)
            via = await gateway.post(bodies.next(case), case.policy)
            if i >= WARM_UP:
                result.direct.append(direct)
                result.gateway.append(via)
        result.gateway_cpu_s = fleet.cpu_s(case.via) - cpu_before
    finally:
        await asyncio.gather(*(channel.close() for channel in (*engines, gateway)))
    return result


async def compare_blocks(
    case: Case, fleet: Fleet, new: ChannelFactory, bodies: Bodies, rounds: int = 4
) -> Comparison:
    """Closed-loop blocks at `case.concurrency`, direct and via the gateway in turn; the
    first block of each is a warm-up."""
    result = Comparison()
    per_block = max(case.concurrency, case.requests // rounds)
    direct_urls = [fleet.engine_urls[w % len(fleet.engine_urls)] for w in range(case.concurrency)]
    gateway_urls = [fleet.gateway_url] * case.concurrency
    for block in range(rounds + 1):
        direct = await closed_loop(case, direct_urls, new, bodies, count=per_block)
        cpu_before = fleet.cpu_s("gateway")
        via = await closed_loop(case, gateway_urls, new, bodies, count=per_block)
        if block:
            result.direct.extend(direct)
            result.gateway.extend(via)
            result.gateway_cpu_s += fleet.cpu_s("gateway") - cpu_before
    return result


async def closed_loop(
    case: Case,
    urls: list[str],
    new: ChannelFactory,
    bodies: Bodies,
    *,
    count: int | None = None,
    until: float | None = None,
) -> list[Timing]:
    """One worker per URL, each sending its next request when the last one is answered,
    until `count` requests were sent in all or the clock passes `until`."""
    timings: list[Timing] = []
    tickets = itertools.count()

    def more() -> bool:
        if until is not None:
            return time.perf_counter() < until
        return next(tickets) < (count or 0)

    async def worker(url: str) -> None:
        channel = new(url)
        try:
            while more():
                timings.append(await channel.post(bodies.next(case), case.policy))
        finally:
            await channel.close()

    await asyncio.gather(*(worker(url) for url in urls))
    return timings


async def throughput(
    fleet: Fleet, new: ChannelFactory, bodies: Bodies, concurrency: int, seconds: float
) -> dict[str, Any]:
    """Closed-loop requests/s, direct then through the gateway, with each process's CPU."""
    case = Case("rps", "round-robin", concurrency, 0)
    direct_urls = [fleet.engine_urls[w % len(fleet.engine_urls)] for w in range(concurrency)]
    figures: dict[str, Any] = {"concurrency": concurrency, "seconds": seconds}
    for side, urls in (("direct", direct_urls), ("gateway", [fleet.gateway_url] * concurrency)):
        await closed_loop(case, urls, new, bodies, until=time.perf_counter() + 0.5)
        cpu_before = fleet.cpu_by_process()
        started = time.perf_counter()
        timings = await closed_loop(case, urls, new, bodies, until=started + seconds)
        elapsed = time.perf_counter() - started
        cpu = {name: s - cpu_before[name] for name, s in fleet.cpu_by_process().items()}
        ok = sum(t.status == 200 for t in timings)
        figures[f"max_rps_{side}"] = round(ok / elapsed, 1)
        figures[f"{side}_errors"] = len(timings) - ok
        figures[f"{side}_error_statuses"] = _statuses(timings)
        figures[f"{side}_p50_ms"] = _ms([t.total_s for t in timings], 50)
        figures[f"{side}_cpu_cores"] = {n: round(s / elapsed, 2) for n, s in cpu.items()}
        figures[f"{side}_cpu_us_per_request"] = {
            n: round(s / max(1, ok) * 1e6) for n, s in cpu.items()
        }
    return figures


# --------------------------------------------------------------------------- figures


def _ms(values: list[float], pct: float) -> float:
    return round(percentile(values, pct) * 1e3, 3)


def _statuses(timings: list[Timing]) -> dict[str, int]:
    """How many answers had each non-200 status."""
    return dict(Counter(str(t.status) for t in timings if t.status != 200))


def _measured(case: Case, timings: list[Timing]) -> list[float]:
    return [t.first_s if case.stream else t.total_s for t in timings]


def summarise(case: Case, comparison: Comparison) -> dict[str, Any]:
    direct = _measured(case, comparison.direct)
    gateway = _measured(case, comparison.gateway)
    figures: dict[str, Any] = {
        "policy": case.policy,
        "concurrency": case.concurrency,
        "distinct_prompts": case.distinct,
        "stream": case.stream,
        "via": case.via,
        "requests": len(direct),
        "errors": comparison.errors,
        "error_statuses": _statuses([*comparison.direct, *comparison.gateway]),
    }
    for pct in (50, 99):
        figures[f"direct_p{pct}_ms"] = _ms(direct, pct)
        figures[f"gateway_p{pct}_ms"] = _ms(gateway, pct)
        figures[f"added_p{pct}_ms"] = round(_ms(gateway, pct) - _ms(direct, pct), 3)
    figures["gateway_cpu_us_per_request"] = round(comparison.gateway_cpu_s / len(gateway) * 1e6)
    return figures


def headline(cases: dict[str, dict[str, Any]], rps: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for key, case in cases.items():
        prefix = "stream_first_chunk_added" if case["stream"] else "added"
        suffix = "" if case["stream"] else f"_{key}"
        figures[f"{prefix}_p50_ms{suffix}"] = case["added_p50_ms"]
        figures[f"{prefix}_p99_ms{suffix}"] = case["added_p99_ms"]
    figures["max_rps_gateway"] = rps["max_rps_gateway"]
    figures["max_rps_direct"] = rps["max_rps_direct"]
    figures["gateway_cpu_us_per_request_c1"] = cases["c1"]["gateway_cpu_us_per_request"]
    return figures


# --------------------------------------------------------------------------- command


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--quick", action="store_true", help="fewer requests, shorter phases (< 40 s)")
    add("--requests", type=int, default=None, help="requests per side and case at "
        "concurrency 1 (default 2000; quick 150)")  # fmt: skip
    add("--requests-c32", type=int, default=None, help="requests per side and case at "
        "concurrency 32 (default 4000; quick 320)")  # fmt: skip
    add("--stream-requests", type=int, default=None, help="streamed requests per side")
    add("--duration", type=float, default=None, help="seconds per throughput run (10; quick 3)")
    add("--rps-concurrency", type=int, default=64, help="requests in flight, throughput run")
    add("--engines", type=int, default=1, help="simulated engine processes (default 1)")
    add("--client", choices=["raw", "httpx"], default="raw", help="load generator's client")
    add("--profile-gateway", type=Path, default=None, metavar="PATH",
        help="run the gateway under cProfile (CPU clock), save the stats here")  # fmt: skip
    add_output_arguments(parser, "overhead")  # --json, --plot


@dataclass(frozen=True)
class Plan:
    requests: int
    requests_c32: int
    stream_requests: int
    duration_s: float
    rps_concurrency: int
    engines: int
    client: str
    profile: Path | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        requests = args.requests or (150 if args.quick else 2000)
        return cls(
            requests=requests,
            requests_c32=args.requests_c32 or (320 if args.quick else 4000),
            stream_requests=args.stream_requests or requests,
            duration_s=args.duration or (3.0 if args.quick else 10.0),
            rps_concurrency=args.rps_concurrency,
            engines=args.engines,
            client=args.client,
            profile=args.profile_gateway,
        )

    def cases(self) -> list[Case]:
        one, many = self.requests, self.requests_c32
        return [
            Case("c1", "round-robin", 1, one),
            Case("c1_relay", "round-robin", 1, one, via="relay"),
            Case("c32", "round-robin", 32, many),
            Case("c1_tokenized", "prefix-cache", 1, one),
            Case("c1_tokenized_distinct", "prefix-cache", 1, one, distinct=True),
            Case("c32_tokenized", "prefix-cache", 32, many),
            Case("c32_tokenized_distinct", "prefix-cache", 32, many, distinct=True),
            Case("stream", "round-robin", 1, self.stream_requests, stream=True),
        ]

    def config(self) -> dict[str, Any]:
        return {
            "requests_c1": self.requests,
            "requests_c32": self.requests_c32,
            "stream_requests": self.stream_requests,
            "throughput_seconds": self.duration_s,
            "throughput_concurrency": self.rps_concurrency,
            "engines": self.engines,
            "client": self.client,
            "profiled": self.profile is not None,
            "cpu_cores": os.cpu_count(),
            "processes": "engines, gateway (kvgate serve), load generator: one process each",
            "load_average_before": [round(v, 2) for v in os.getloadavg()],
        }


Samples = dict[str, tuple[list[float], list[float]]]
T = TypeVar("T")


def run(args: argparse.Namespace) -> int:
    plan = Plan.from_args(args)
    try:
        results, samples = asyncio.run(_stoppable(bench(plan)))
    except (RuntimeError, OSError, EOFError) as exc:  # EOFError: a server hung up mid-answer
        print(f"kvgate bench overhead: {exc!r}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("kvgate bench overhead: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    report(results)
    write_json(args.json, results)
    print(f"JSON written to {args.json}")
    plot(args.plot, samples, results)
    print(f"plot written to {args.plot}")
    if plan.profile is not None:
        print_profile(plan.profile)
    failed: Counter[str] = Counter()
    for case in results["cases"].values():
        failed.update(case["error_statuses"])
    for side in ("direct", "gateway"):
        failed.update(results["throughput"][f"{side}_error_statuses"])
    if failed:
        print(f"kvgate bench overhead: failed requests by status: {dict(failed)}", file=sys.stderr)
    return 1 if failed else 0


async def _stoppable(work: Coroutine[Any, Any, T]) -> T:
    """`work`, cancelled on SIGTERM as asyncio.run cancels it on Ctrl-C, so that every
    process it started is stopped either way."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def bench(plan: Plan) -> tuple[dict[str, Any], Samples]:
    results: dict[str, Any] = {"config": plan.config(), "cases": {}}
    samples: Samples = {}
    bodies = Bodies()
    with tempfile.TemporaryDirectory(prefix="kvgate-overhead-") as workdir:
        async with (
            client_factory(plan.client) as new,
            running_fleet(plan.engines, Path(workdir), plan.profile) as fleet,
        ):
            for case in plan.cases():
                print(f"  {case.key}: {case.requests} requests per side...", flush=True)
                compare = compare_c1 if case.concurrency == 1 else compare_blocks
                comparison = await compare(case, fleet, new, bodies)
                results["cases"][case.key] = summarise(case, comparison)
                samples[case.key] = (
                    [v * 1e3 for v in _measured(case, comparison.direct)],
                    [v * 1e3 for v in _measured(case, comparison.gateway)],
                )
            print(f"  throughput: {plan.duration_s:g} s per side...", flush=True)
            rps = await throughput(fleet, new, bodies, plan.rps_concurrency, plan.duration_s)
            results["config"]["pids"] = {c.name: c.proc.pid for c in fleet.children}
    results["throughput"] = rps
    results["config"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    results.update(headline(results["cases"], rps))
    return results, samples


# --------------------------------------------------------------------------- output


def report(results: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str]] = []
    for key, case in results["cases"].items():
        rows.append((
            f"{key} ({case['policy']}, c={case['concurrency']})",
            f"{case['direct_p50_ms']:.3f} / {case['direct_p99_ms']:.3f} direct",
            f"{case['gateway_p50_ms']:.3f} / {case['gateway_p99_ms']:.3f} ms via {case['via']} "
            f"(p50 / p99{', first chunk' if case['stream'] else ''}); {case['via']} CPU "
            f"{case['gateway_cpu_us_per_request']} us/req; errors {case['errors']}",
        ))  # fmt: skip
    for key, value in results.items():
        if key.startswith(("added_", "stream_", "max_rps", "gateway_cpu")):
            rows.append((key, _value(key, value), _target_note(key, value)))
    rps = results["throughput"]
    for side in ("direct", "gateway"):
        cores = ", ".join(f"{n} {v:.2f}" for n, v in rps[f"{side}_cpu_cores"].items())
        rows.append((f"CPU cores busy, {side} run", cores, _busiest(rps[f"{side}_cpu_cores"])))
    config = results["config"]
    load = config["load_average_before"][0]
    print_table(
        f"kvgate overhead: {config['engines']} engine process(es), 1 gateway process and the "
        f"load generator ({config['client']} client) share {config['cpu_cores']} CPU cores; "
        f"load average {load:.1f} at start"
        + (" (other work was running: figures are noisy)" if load > 1 else "")
        + (" — PROFILED: figures include cProfile's overhead" if config["profiled"] else ""),
        rows,
    )


def _value(key: str, value: float) -> str:
    if key.startswith("max_rps"):
        return f"{value:,.1f} req/s"
    return f"{value} us" if key.startswith("gateway_cpu") else f"{value:.3f} ms"


def _target_note(key: str, value: float) -> str:
    if key not in TARGETS:
        return ""
    op, target = TARGETS[key]
    ok = value >= target if op == ">=" else value <= target
    return f"target {op} {target:g}  {'ok' if ok else 'MISSED'}"


def _busiest(cores: dict[str, float]) -> str:
    name, busy = max(cores.items(), key=lambda item: item[1])
    return f"busiest: {name} ({busy:.0%} of a core)" + (", saturated" if busy > 0.9 else "")


def plot(path: Path, samples: Samples, results: dict[str, Any]) -> None:
    plt = pyplot(path)
    panels = {
        "c1": "round-robin, concurrency 1",
        "c32": "round-robin, concurrency 32",
        "c1_tokenized_distinct": "prefix-cache, c=1, distinct prompts",
        "stream": "time to first streamed chunk, c=1",
    }
    figure, axes = plt.subplots(2, 2, figsize=(11, 7))
    for axis, (key, title) in zip(axes.flat, panels.items(), strict=True):
        lines = [("direct", "-", samples[key][0]), ("via gateway", "-", samples[key][1])]
        if key == "c1":
            direct_run, relay = samples["c1_relay"]
            lines.append(("direct (relay run)", "--", direct_run))
            lines.append(("via a byte relay", "--", relay))
        for label, style, values in lines:
            ordered = sorted(values)
            fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
            axis.plot(ordered, fractions, style, label=label)
        axis.set_xscale("log")
        axis.set_xlabel("ms")
        axis.set_ylabel("fraction of requests")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    figure.suptitle(
        f"kvgate overhead (latency CDFs); max {results['max_rps_gateway']:,.0f} req/s via the "
        f"gateway, {results['max_rps_direct']:,.0f} direct"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def print_profile(path: Path, top: int = 30) -> None:
    if not path.exists():
        print(f"no gateway profile was written to {path}", file=sys.stderr)
        return
    print(f"\ngateway CPU profile ({path}), top {top} by cumulative time:")
    pstats.Stats(str(path)).sort_stats("cumulative").print_stats(top)
