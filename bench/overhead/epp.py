"""`kvgate bench overhead`'s pick phase: the latency of a pick by `kvgate epp` (its own
process, in front of the measured fleet), as Envoy sees it over a real gRPC channel —
from the request headers sent, in BUFFERED mode, to the answer naming the endpoint (the
headers' answer, then the buffered body's) — at concurrency 1 and 32. Each request is a
distinct chat (tokenized in-process with the model's files, hashed, matched: the default
policy's whole decision); its stream then ends, releasing the booking."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench.harness.fleet import MODEL
from bench.harness.gateway import GatewayProcess
from bench.harness.ports import free_port_block
from bench.overhead.fleet import LOCAL_TOKENIZER
from gateway.epp.client import EnvoyClient, request_pick

CHAT = "/v1/chat/completions"


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


async def _pick(envoy: EnvoyClient, index: int) -> float:
    stream = envoy.stream()
    started = time.perf_counter()
    answers = await request_pick(stream, CHAT, _body(index), mode="BUFFERED")
    elapsed = time.perf_counter() - started
    if answers[-1].destination is None:
        raise RuntimeError(f"the picker did not pick: {answers[-1]}")
    await stream.done_writing()
    await stream.read()  # the stream's end: the booking released
    return elapsed


async def _run(envoy: EnvoyClient, concurrency: int, requests: int, first: int) -> list[float]:
    latencies: list[float] = []
    counter = iter(range(first, first + requests))

    async def worker() -> None:
        for index in counter:
            latencies.append(await _pick(envoy, index))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def _figures(latencies: list[float]) -> dict[str, Any]:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"requests": len(latencies), "p50_ms": round(cuts[49] * 1e3, 3),
            "p90_ms": round(cuts[89] * 1e3, 3), "p99_ms": round(cuts[98] * 1e3, 3)}  # fmt: skip


async def pick_phase(
    pods_file: Path, log: Path, requests: int, requests_c32: int
) -> dict[str, Any]:
    """Start `kvgate epp` on `pods_file`, warm it, measure; its figures by concurrency."""
    picker = EppProcess(pods_file, log)
    await picker.start(30.0)
    envoy = EnvoyClient(f"127.0.0.1:{picker.grpc_port}")
    try:
        await _run(envoy, 1, 50, 10_000_000)  # warm: channel, tokenizer, caches
        c1 = _figures(await _run(envoy, 1, requests, 0))
        c32 = _figures(await _run(envoy, 32, requests_c32, requests))
    finally:
        await envoy.close()
        await picker.stop(15.0)
    return {"c1": c1, "c32": c32, "mode": "BUFFERED", "target_p50_c1_ms": 1.0,
            "met": c1["p50_ms"] <= 1.0}  # fmt: skip
