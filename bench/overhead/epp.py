"""`kvgate bench overhead`'s pick phase: the latency of a pick by `kvgate epp` (its own
process, in front of the measured fleet), as Envoy sees it over a real gRPC channel —
from the request headers sent to the answer naming the endpoint — in the two body modes
gateways configure: FULL_DUPLEX_STREAMED (the Inference Extension's: headers and body
sent, then the answers) and BUFFERED (headers answered, then the body's answer naming the
endpoint), at concurrency 1 and 32. Each request is a distinct chat (tokenized
in-process with the model's files, hashed, matched: the default policy's whole decision);
its stream then ends, releasing the booking.

Beside it, the same client times a null picker (`null_picker.py`: the same messages, no
decision), request by request in turn at c=1 and in alternating blocks at c=32: that is
the gRPC exchange's own cost to this client, and the difference is what a pick adds.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.fleet import MODEL
from bench.harness.gateway import GatewayProcess
from bench.harness.ports import free_port_block
from bench.harness.processes import ChildProcess, log_tail
from bench.overhead.fleet import LOCAL_TOKENIZER
from gateway.epp.client import EnvoyClient, request_pick
from gateway.epp.protocol import BodyMode

CHAT = "/v1/chat/completions"
MODES: tuple[BodyMode, ...] = ("FULL_DUPLEX_STREAMED", "BUFFERED")
C32 = 32
BLOCKS = 4
TARGET_MS = 1.0
"""The issue's bound on the latency a pick adds at c=1, FULL_DUPLEX_STREAMED."""


class EppProcess(GatewayProcess):
    """`kvgate epp --pods FILE --port P --grpc-port G`, ready when GET /ready answers."""

    def __init__(self, pods_file: Path, log_path: Path) -> None:
        super().__init__(pods_file, log_path, env=LOCAL_TOKENIZER, name="epp")
        self.grpc_port = 0

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("serve")] = "epp"
        return [*command, "--host", "127.0.0.1", "--grpc-port", str(self.grpc_port)]

    async def spawn_only(self) -> None:
        self.grpc_port = free_port_block(1, random.Random())
        await super().spawn_only()


def _body(index: int) -> bytes:
    question = f"question number {index}: what is a KV cache?"
    messages = [
        {"role": "system", "content": "You are a helpful assistant. " * 20},
        {"role": "user", "content": question},
    ]
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4}).encode()


class NullPicker(ChildProcess):
    """`python -m bench.overhead.null_picker ENDPOINT`, its port read from its stdout."""

    def __init__(self, log_path: Path) -> None:
        super().__init__("null-picker", log_path)
        self.port = 0

    async def start(self, endpoint: str, timeout_s: float) -> None:
        command = [sys.executable, "-m", "bench.overhead.null_picker", endpoint]
        await self.spawn(command, pipe=True)
        line = await asyncio.wait_for(self.readline(), timeout_s)
        if not line.strip().isdigit():
            raise RuntimeError(f"the null picker did not start: {log_tail(self.log_path)}")
        self.port = int(line)
        self.follow()


async def _pick(envoy: EnvoyClient, index: int, mode: BodyMode) -> float:
    stream = envoy.stream()
    started = time.perf_counter()
    answers = await request_pick(stream, CHAT, _body(index), mode=mode)
    elapsed = time.perf_counter() - started
    if not any(answer.destination for answer in answers):
        raise RuntimeError(f"the picker did not pick: {answers[-1]}")
    await stream.done_writing()
    await stream.read()  # the stream's end: the booking released
    return elapsed


async def _alternating(
    pickers: tuple[EnvoyClient, EnvoyClient], mode: BodyMode, requests: int, first: int
) -> tuple[list[float], list[float]]:
    """c=1: one request to each in turn, the first of each pair alternating."""
    timed: tuple[list[float], list[float]] = ([], [])
    for i in range(requests):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            timed[side].append(await _pick(pickers[side], first + 2 * i + side, mode))
    return timed


async def _closed_loop(
    envoy: EnvoyClient, mode: BodyMode, concurrency: int, requests: int, first: int
) -> list[float]:
    latencies: list[float] = []
    counter = iter(range(first, first + requests))

    async def worker() -> None:
        for index in counter:
            latencies.append(await _pick(envoy, index, mode))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def _blocks(
    pickers: tuple[EnvoyClient, EnvoyClient], mode: BodyMode, requests: int, first: int
) -> tuple[list[float], list[float]]:
    """c=32: closed-loop blocks, the picker's and the null one's in turn, order alternating
    from block to block."""
    timed: tuple[list[float], list[float]] = ([], [])
    per_block = max(1, requests // BLOCKS)
    for block in range(BLOCKS):
        for side in (0, 1) if block % 2 == 0 else (1, 0):
            start = first + (2 * block + side) * per_block
            timed[side].extend(await _closed_loop(pickers[side], mode, C32, per_block, start))
    return timed


def _figures(latencies: list[float]) -> dict[str, Any]:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"requests": len(latencies), "p50_ms": round(cuts[49] * 1e3, 3),
            "p90_ms": round(cuts[89] * 1e3, 3), "p99_ms": round(cuts[98] * 1e3, 3)}  # fmt: skip


def _spread(picked: list[float], null: list[float], parts: int = BLOCKS) -> list[float]:
    """The added p50 in each of `parts` consecutive slices of the run (ms): its spread."""
    size = len(picked) // parts
    spread = []
    for i in range(parts):
        part = slice(i * size, (i + 1) * size)
        added = statistics.median(picked[part]) - statistics.median(null[part])
        spread.append(round(added * 1e3, 3))
    return spread


def _compare(picked: list[float], null: list[float]) -> dict[str, Any]:
    figures = {"picker": _figures(picked), "null": _figures(null)}
    added = figures["picker"]["p50_ms"] - figures["null"]["p50_ms"]
    by_slice = _spread(picked, null)
    return {**figures, "added_p50_ms": round(added, 3), "added_p50_ms_by_slice": by_slice}


async def pick_phase(
    pods_file: Path, log: Path, requests: int, requests_c32: int
) -> dict[str, Any]:
    """Start `kvgate epp` on `pods_file` and the null picker beside it, warm both, measure;
    the figures by body mode and concurrency."""
    picker = EppProcess(pods_file, log)
    null = NullPicker(log.with_name("null-picker.log"))
    await picker.start(30.0)
    clients: list[EnvoyClient] = []
    try:
        await null.start("127.0.0.1:1", 30.0)
        clients += [EnvoyClient(f"127.0.0.1:{picker.grpc_port}"),
                    EnvoyClient(f"127.0.0.1:{null.port}")]  # fmt: skip
        pair = (clients[0], clients[1])
        await _alternating(pair, "FULL_DUPLEX_STREAMED", 50, 10_000_000)  # warm both
        results: dict[str, Any] = {}
        first = 0
        for mode in MODES:
            c1 = _compare(*await _alternating(pair, mode, requests, first))
            first += 2 * requests
            c32 = _compare(*await _blocks(pair, mode, requests_c32, first))
            first += 2 * requests_c32
            results[mode] = {"c1": c1, "c32": c32}
    finally:
        for client in clients:
            await client.close()
        await null.stop(5.0)
        await picker.stop(15.0)
    headline = results["FULL_DUPLEX_STREAMED"]["c1"]
    return {**results, "target_added_p50_c1_ms": TARGET_MS,
            "met": headline["added_p50_ms"] <= TARGET_MS}  # fmt: skip
