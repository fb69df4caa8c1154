"""`kvgate bench sim`: one simulated engine's sustainable requests/s and KV events/s.

The engine runs in its own process (`python -m simulator`, free ports), so the load generator
here does not share its event loop. Workers send non-streaming completions whose prompts share
a few system prefixes and end in a unique tail, so every request stores new blocks and, once
the cache is full, evicts old ones; a ZMQ SUB counts the published batches and events. The
latency model is divided by a large `--time-scale`, so the figures measure the simulator
itself (HTTP, tokenizer, cache, scheduler, encoder, PUB), not simulated GPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import zmq
import zmq.asyncio

from bench.results_io import RUNS_DIR
from simulator.publisher import EventPublisher
from simulator.wire import (
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventEncoder,
    KVEvent,
    decode_batch,
)

_READY = re.compile(r"http (?P<url>http://\S+) .*events=(?P<events>\S+) replay=(?P<replay>\S+)")
_WORDS = ("cache", "token", "prefix", "block", "route", "engine", "event", "hash", "tree", "key")


@dataclass
class SimBenchResult:
    duration_s: float
    concurrency: int
    requests: int
    errors: int
    requests_per_s: float
    batches_per_s: float
    events_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    cached_token_ratio: float
    prompt_tokens_mean: float
    publisher_events_per_s: float


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a 5 s run (default 20 s)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request")
    parser.add_argument("--time-scale", type=float, default=1000.0, help="sim --time-scale")
    parser.add_argument("--gpu-blocks", type=int, default=2048, help="sim --gpu-blocks")
    parser.add_argument(
        "--json",
        type=Path,
        default=RUNS_DIR / "sim.json",
        help="write the result here (default bench/results/runs/sim.json; with --keep "
        "bench/results/sim.json)",
    )


def _prompt(index: int) -> str:
    system = f"System prompt {index % 4}: " + " ".join(_WORDS[(index + i) % 4] for i in range(300))
    tail = " ".join(_WORDS[(index * 7 + i * 3) % len(_WORDS)] + str(index) for i in range(60))
    return f"{system}\nUser {index}: {tail}"


async def _start_engine(
    args: argparse.Namespace,
) -> tuple[asyncio.subprocess.Process, dict[str, str]]:
    cmd = [
        sys.executable, "-m", "simulator", "--port", "0",
        "--events", "tcp://127.0.0.1:0", "--replay", "tcp://127.0.0.1:0",
        "--time-scale", str(args.time_scale), "--gpu-blocks", str(args.gpu_blocks),
        "--max-batch", "64", "--log-level", "warning",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    match = _READY.search(line)
    if match is None:
        proc.terminate()
        raise RuntimeError(f"simulated engine did not start: {line!r}")
    return proc, match.groupdict()


async def _count_events(sub: zmq.asyncio.Socket, counts: dict[str, int]) -> None:
    while True:
        frames = await sub.recv_multipart()
        counts["batches"] += 1
        counts["events"] += len(decode_batch(frames[2]).events)


async def _load(url: str, args: argparse.Namespace, duration: float) -> dict[str, Any]:
    latencies: list[float] = []
    stats = {"errors": 0, "prompt": 0, "cached": 0}
    deadline = time.perf_counter() + duration
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:

        async def worker() -> None:
            while time.perf_counter() < deadline:
                body = {"prompt": _prompt(next(counter)), "max_tokens": args.max_tokens}
                start = time.perf_counter()
                response = await client.post("/v1/completions", json=body)
                if response.status_code != 200:
                    stats["errors"] += 1
                    continue
                latencies.append(time.perf_counter() - start)
                usage = response.json()["usage"]
                stats["prompt"] += usage["prompt_tokens"]
                stats["cached"] += usage["prompt_tokens_details"]["cached_tokens"]

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return {"latencies": latencies, **stats}


async def _bench(args: argparse.Namespace) -> SimBenchResult:
    duration = args.duration or (5.0 if args.quick else 20.0)
    proc, endpoints = await _start_engine(args)
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoints["events"])
    counts = {"batches": 0, "events": 0}
    counter = asyncio.create_task(_count_events(sub, counts))
    try:
        await asyncio.sleep(0.3)
        await _load(endpoints["url"], args, 1.0)  # warm-up
        counts.update(batches=0, events=0)
        started = time.perf_counter()
        load = await _load(endpoints["url"], args, duration)
        await asyncio.sleep(0.2)
        elapsed = time.perf_counter() - started
    finally:
        counter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await counter
        sub.close(linger=0)
        ctx.term()
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
    lat = sorted(load["latencies"]) or [0.0]
    done = len(load["latencies"])
    return SimBenchResult(
        duration_s=round(elapsed, 2),
        concurrency=args.concurrency,
        requests=done,
        errors=load["errors"],
        requests_per_s=round(done / elapsed, 1),
        batches_per_s=round(counts["batches"] / elapsed, 1),
        events_per_s=round(counts["events"] / elapsed, 1),
        latency_p50_ms=round(statistics.median(lat) * 1e3, 2),
        latency_p99_ms=round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, 2),
        cached_token_ratio=round(load["cached"] / max(1, load["prompt"]), 3),
        prompt_tokens_mean=round(load["prompt"] / max(1, done), 1),
        publisher_events_per_s=await _publisher_only(min(duration, 3.0)),
    )


async def _publisher_only(seconds: float) -> float:
    """Events/s of the encode + PUB path alone, received and decoded by a SUB in-process."""
    ctx = zmq.asyncio.Context()
    publisher = EventPublisher(ctx, events_endpoint="tcp://127.0.0.1:0", replay_endpoint=None)
    await publisher.start()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.events_endpoint)
    counts = {"batches": 0, "events": 0}
    counter = asyncio.create_task(_count_events(sub, counts))
    encoder = EventEncoder("map", "vllm")
    hashes = tuple(range(10**12, 10**12 + 4))
    stored = BlockStored(hashes, None, tuple(range(64)), 16, "GPU")
    removed: list[KVEvent] = [BlockRemoved((h + 7,), "GPU") for h in hashes]
    events = (*removed, stored)
    try:
        await asyncio.sleep(0.3)
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            for _ in range(50):
                await publisher.publish(encoder.encode(EventBatch(time.time(), events)))
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        elapsed = time.perf_counter() - started
    finally:
        counter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await counter
        sub.close(linger=0)
        await publisher.stop()
        ctx.term()
    return round(counts["events"] / elapsed, 1)


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_bench(args))
    rows = asdict(result)
    width = max(len(k) for k in rows)
    print("kvgate bench sim — one simulated engine (separate process), wall-clock figures")
    for key, value in rows.items():
        print(f"  {key:<{width}}  {value}")
    path: Path = args.json
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "sim", "time_scale": args.time_scale, "max_tokens": args.max_tokens}
    path.write_text(json.dumps({**meta, "result": rows}, indent=2) + "\n")
    print(f"  written to {path}")
    return 0 if result.requests and not result.errors else 1
