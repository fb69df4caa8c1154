"""Engine-side figures from each engine's own `/metrics` (vLLM names): prompt-cache
queries and hits (in tokens) and finished requests, read before and after a run; the
cache's size; and the cache reset between runs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.fleet import EngineEndpoint

_QUERIES = "vllm:prefix_cache_queries"
_HITS = "vllm:prefix_cache_hits"
_SUCCESS = "vllm:request_success"
_TTFT = "vllm:time_to_first_token_seconds"


@dataclass(frozen=True, slots=True)
class EngineCounters:
    queries: float = 0.0
    """Prompt tokens looked up in the prefix cache."""
    hits: float = 0.0
    """Prompt tokens found there."""
    requests: float = 0.0
    ttft_sum_s: float = 0.0
    """Sum of the engine's own TTFTs (wall seconds from its queue to the first token)."""
    ttft_count: float = 0.0

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(self))
        )

    def __sub__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(
            *(getattr(self, f.name) - getattr(other, f.name) for f in fields(self))
        )


def parse_counters(text: str) -> EngineCounters:
    sums = {_QUERIES: 0.0, _HITS: 0.0, _SUCCESS: 0.0, f"{_TTFT}_sum": 0.0, f"{_TTFT}_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name in sums and sample.name.endswith("_total"):
                sums[family.name] += sample.value
            elif sample.name in sums:
                sums[sample.name] += sample.value
    return EngineCounters(
        sums[_QUERIES], sums[_HITS], sums[_SUCCESS], sums[f"{_TTFT}_sum"], sums[f"{_TTFT}_count"]
    )


async def read_counters(
    client: httpx.AsyncClient, endpoints: Sequence[EngineEndpoint]
) -> dict[str, EngineCounters]:
    async def one(endpoint: EngineEndpoint) -> EngineCounters:
        response = await client.get(f"{endpoint.url}/metrics")
        response.raise_for_status()
        return parse_counters(response.text)

    values = await asyncio.gather(*(one(e) for e in endpoints))
    return {e.name: v for e, v in zip(endpoints, values, strict=True)}


def deltas(
    after: Mapping[str, EngineCounters], before: Mapping[str, EngineCounters]
) -> dict[str, EngineCounters]:
    return {name: after[name] - before.get(name, EngineCounters()) for name in after}


def engine_ttft_mean_s(per_engine: Mapping[str, EngineCounters]) -> float:
    count = sum(c.ttft_count for c in per_engine.values())
    return sum(c.ttft_sum_s for c in per_engine.values()) / count if count else float("nan")


def hit_rate(per_engine: Mapping[str, EngineCounters]) -> float:
    queries = sum(c.queries for c in per_engine.values())
    hits = sum(c.hits for c in per_engine.values())
    return hits / queries if queries else 0.0


async def cache_capacity_tokens(client: httpx.AsyncClient, url: str) -> int:
    """The engine's KV cache size in tokens (`vllm:cache_config_info`)."""
    text = (await client.get(f"{url}/metrics")).text
    line = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info"))
    labels = dict(
        part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(",")
    )
    return int(labels["num_gpu_blocks"].strip('"')) * int(labels["block_size"].strip('"'))


async def reset_prefix_caches(
    client: httpx.AsyncClient, engine_urls: Sequence[str], *, timeout_s: float = 30.0
) -> None:
    """`POST /reset_prefix_cache` on every engine (SGLang's `/flush_cache` where that is not
    served), retried while one is still busy."""
    async with asyncio.timeout(timeout_s):
        for url in engine_urls:
            path = "/reset_prefix_cache"
            while True:
                response = await client.post(f"{url}{path}")
                if response.status_code == 200:
                    break
                if response.status_code == 404 and path != "/flush_cache":
                    path = "/flush_cache"
                    continue
                if response.status_code != 400:
                    response.raise_for_status()
                await asyncio.sleep(0.1)  # 400: requests still running there
