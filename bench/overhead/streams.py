"""The streaming phase: many concurrent long streams relayed chunk by chunk (set-up and
figures: docs/benchmarks.md, "Many concurrent long streams").

Streams start at even intervals rather than all at once: started together they would
queue for the engine's prefills one by one, and a router that spreads their arrival over a
few ms would move some into a later step, so TTFT would measure the engine's schedule.
Each stream opens a new connection (sglang-router stalls the first chunk of a stream on a
kept-alive one; the same for every target keeps them comparable).

TTFT percentiles carry the engine's schedule (0–60 ms here), so their differences move by
a few ms between runs; the engine's own mean TTFT (`/metrics`) subtracted from the
client's gives the time spent outside it, and a router's minus direct's
(`stream_added_ttft_outside_engine_mean_ms`) what the router adds, without that noise.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.engine_stats import EngineCounters, parse_counters
from bench.harness.fleet import MODEL
from bench.harness.streaming import ChatAnswer, post_chat
from bench.overhead.fleet import Fleet
from bench.results_io import percentile

DIRECT = "direct"
KVGATE = "kvgate"
StreamSamples = dict[str, tuple[list[float], list[float]]]
"""Per target: every stream's TTFT and every inter-chunk gap, in milliseconds."""
_PROMPT = "You are a helpful assistant. Tell the user a long story about a lighthouse keeper."


@dataclass(frozen=True)
class StreamPlan:
    streams: int
    """Concurrent streams per target and round."""
    tokens: int
    """Tokens (text chunks) per stream."""
    rounds: int
    decode_ms: tuple[float, float]
    """The engine's `--decode-ms-per-token` and `--decode-ms-per-seq`."""
    kvgate_policy: str | None = None
    """Sent as `x-kvgate-policy` (None: the gateway's default policy, prefix-cache)."""

    @property
    def gap_s(self) -> float:
        """The engine's decode step with `streams` sequences running."""
        per_token, per_seq = self.decode_ms
        return (per_token + per_seq * self.streams) / 1e3

    @property
    def per_round(self) -> int:
        return 2 * self.streams

    @property
    def interval_s(self) -> float:
        """Between two stream starts: one stream's expected duration / `streams`."""
        return self.tokens * self.gap_s / self.streams

    def config(self) -> dict[str, Any]:
        per_token, per_seq = self.decode_ms
        return {
            "streams": self.streams,
            "tokens_per_stream": self.tokens,
            "rounds": self.rounds,
            "decode_ms_per_token": per_token,
            "decode_ms_per_seq": per_seq,
            "expected_gap_ms": round(self.gap_s * 1e3, 2),
            "streams_per_round": self.per_round,
            "start_interval_ms": round(self.interval_s * 1e3, 2),
            "kvgate_policy": self.kvgate_policy or "prefix-cache (its default)",
            "connections": "a new one per stream, every target",
        }


@dataclass
class Target:
    """What one target's streams gave, over every round."""

    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    streams: int = 0
    chunks: int = 0
    """Chunks carrying text, as counted by the client."""
    engine_chunks: int = 0
    """Completion tokens the engine reported (one text chunk each)."""
    failures: Counter[str] = field(default_factory=Counter)
    cpu_s: Counter[str] = field(default_factory=Counter)
    """CPU seconds per process while this target's streams ran."""
    seconds: float = 0.0
    engine: EngineCounters = field(default_factory=EngineCounters)
    """What the engine counted while this target's streams ran (its own TTFTs)."""


def _body(index: int, tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Stream {index}. {_PROMPT}"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _run_streams(
    client: httpx.AsyncClient,
    url: str,
    count: int,
    tokens: int,
    first: int,
    into: Target,
    interval_s: float = 0.0,
) -> None:
    """`count` streams, the i-th started `i × interval_s` after the first."""
    path = f"{url}/v1/chat/completions"
    started = time.perf_counter()

    async def one(i: int) -> ChatAnswer:
        await asyncio.sleep(max(0.0, started + i * interval_s - time.perf_counter()))
        return await post_chat(client, path, _body(first + i, tokens))

    answers = await asyncio.gather(*(one(i) for i in range(count)))
    for answer in answers:
        into.streams += 1
        if answer.failure is not None or not answer.done:
            into.failures[answer.failure or "cut"] += 1
        times = answer.token_times
        if times:
            into.ttft_s.append(times[0] - answer.started)
            into.gaps_s.extend(b - a for a, b in itertools.pairwise(times))
        into.chunks += len(times)
        into.engine_chunks += answer.usage_int("completion_tokens")


async def stream_phase(plan: StreamPlan, fleet: Fleet) -> tuple[dict[str, Any], StreamSamples]:
    """Every target's streams, rounds in rotating order; the phase's figures and samples."""
    urls = {DIRECT: fleet.engine_urls[0], KVGATE: fleet.gateway_url, **fleet.peer_urls}
    order = list(urls)
    targets = {name: Target() for name in order}
    # No pooled connection is kept: each stream connects anew.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    headers = {"x-kvgate-policy": plan.kvgate_policy} if plan.kvgate_policy else {}
    async with httpx.AsyncClient(timeout=120.0, limits=limits, headers=headers) as client:
        for url in urls.values():  # warm-up: imports, pools, the engine's first batches
            await _run_streams(client, url, 4, 8, 0, Target())
        serial = 0
        for round_ in range(plan.rounds):
            rotated = order[round_ % len(order) :] + order[: round_ % len(order)]
            for name in rotated:
                print(f"    streams, round {round_ + 1}: {name}", flush=True)
                before = fleet.cpu_by_process()
                counted = await _engine_counters(client, urls[DIRECT])
                started = time.perf_counter()
                target = targets[name]
                await _run_streams(
                    client, urls[name], plan.per_round, plan.tokens, serial, target,
                    plan.interval_s,
                )  # fmt: skip
                target.seconds += time.perf_counter() - started
                counters = await _engine_counters(client, urls[DIRECT]) - counted
                target.engine += counters
                target.cpu_s.update({n: s - before[n] for n, s in fleet.cpu_by_process().items()})
                serial += plan.per_round
    samples = {
        name: ([v * 1e3 for v in t.ttft_s], [v * 1e3 for v in t.gaps_s])
        for name, t in targets.items()
    }
    return summarise_streams(plan, targets), samples


async def _engine_counters(client: httpx.AsyncClient, engine_url: str) -> EngineCounters:
    response = await client.get(f"{engine_url}/metrics")
    response.raise_for_status()
    return parse_counters(response.text)


def _ms(values: list[float], pct: float) -> float:
    return round(percentile(values, pct) * 1e3, 3) if values else float("nan")


def _target_figures(target: Target) -> dict[str, Any]:
    per_1k = 1e6 / max(1, target.chunks)
    engine_ttft_s = target.engine.ttft_sum_s / max(1.0, target.engine.ttft_count)
    client_ttft_s = sum(target.ttft_s) / max(1, len(target.ttft_s))
    return {
        "streams": target.streams,
        "chunks": target.chunks,
        "engine_chunks": target.engine_chunks,
        "failed_streams": dict(target.failures),
        "seconds": round(target.seconds, 2),
        "chunks_per_s": round(target.chunks / target.seconds, 1) if target.seconds else 0.0,
        "ttft_p50_ms": _ms(target.ttft_s, 50),
        "ttft_p99_ms": _ms(target.ttft_s, 99),
        "ttft_mean_ms": round(client_ttft_s * 1e3, 3),
        "engine_ttft_mean_ms": round(engine_ttft_s * 1e3, 3),
        "ttft_outside_engine_mean_ms": round((client_ttft_s - engine_ttft_s) * 1e3, 3),
        "itl_p50_ms": _ms(target.gaps_s, 50),
        "itl_p99_ms": _ms(target.gaps_s, 99),
        "cpu_ms_per_1k_chunks_by_process": {
            n: round(s * per_1k, 1) for n, s in sorted(target.cpu_s.items())
        },
    }


def summarise_streams(plan: StreamPlan, targets: dict[str, Target]) -> dict[str, Any]:
    """Per target its own figures; per router its process's CPU per 1,000 relayed chunks
    and what it adds to direct (JSON keys `stream_*`). `stream_background_cpu_ms_per_1k_chunks`:
    what the router's process used while the direct streams ran (its background work:
    kvgate follows the engine's KV events, scrapes its metrics, checks its health), at the
    same rate over its own streams' time; included in `stream_cpu_ms_per_1k_chunks`."""
    sides = {name: _target_figures(target) for name, target in targets.items()}
    direct, direct_s = sides[DIRECT], max(targets[DIRECT].seconds, 1e-9)
    routers: dict[str, dict[str, Any]] = {}
    for name, side in sides.items():
        if name == DIRECT:
            continue
        process = name  # each router's process is named after it
        cpu_s = targets[name].cpu_s[process]
        background_s = targets[DIRECT].cpu_s[process] / direct_s * targets[name].seconds
        routers[name] = {
            "stream_cpu_ms_per_1k_chunks": round(cpu_s * 1e6 / max(1, side["chunks"]), 1),
            "stream_background_cpu_ms_per_1k_chunks": round(
                background_s * 1e6 / max(1, side["chunks"]), 1
            ),
            "stream_added_ttft_p50_ms": round(side["ttft_p50_ms"] - direct["ttft_p50_ms"], 3),
            "stream_added_ttft_p99_ms": round(side["ttft_p99_ms"] - direct["ttft_p99_ms"], 3),
            "stream_added_ttft_outside_engine_mean_ms": round(
                side["ttft_outside_engine_mean_ms"] - direct["ttft_outside_engine_mean_ms"], 3
            ),
            "stream_added_itl_p50_ms": round(side["itl_p50_ms"] - direct["itl_p50_ms"], 3),
            "stream_added_itl_p99_ms": round(side["itl_p99_ms"] - direct["itl_p99_ms"], 3),
            "stream_chunks": side["chunks"],
        }
    return {"config": plan.config(), "targets": sides, "routers": routers}
