"""The engine's `/metrics` page, with vLLM's metric names and labels (see WIRE.md).

Gauges are refreshed from the engine just before each scrape; counters are incremented as
things happen. Each engine has its own registry, so a fleet in one process never mixes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class GaugeReadings:
    running: int
    waiting: int
    kv_cache_usage: float


class EngineMetrics:
    def __init__(
        self,
        *,
        model_name: str,
        block_size: int,
        gpu_blocks: int,
        host_blocks: int,
        read_gauges: Callable[[], GaugeReadings],
    ) -> None:
        self.registry = CollectorRegistry()
        self._read = read_gauges
        labels = ["engine", "model_name"]
        self._labels = {"engine": "0", "model_name": model_name}
        reg = self.registry
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels,
            registry=reg,
        )  # fmt: skip
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels,
            registry=reg,
        )  # fmt: skip
        self.usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels,
            registry=reg,
        )  # fmt: skip
        self.queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels,
            registry=reg,
        )
        self.hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels,
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels,
            registry=reg,
        )  # fmt: skip
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=reg,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=_TTFT_BUCKETS,
            registry=reg,
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "enable_prefix_caching", "engine", "num_cpu_blocks", "num_gpu_blocks"],
            registry=reg,
        )
        info.labels(
            block_size=str(block_size),
            enable_prefix_caching="True",
            engine="0",
            num_cpu_blocks=str(host_blocks) if host_blocks else "None",
            num_gpu_blocks=str(gpu_blocks),
        ).set(1)
        for reason in ("stop", "length", "abort", "error"):
            self.success.labels(**self._labels, finished_reason=reason)

    def observe_request(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.queries.labels(**self._labels).inc(prompt_tokens)
        self.hits.labels(**self._labels).inc(cached_tokens)
        self.prompt_tokens.labels(**self._labels).inc(prompt_tokens)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.labels(**self._labels).observe(seconds)

    def observe_finished(self, generated: int, reason: str) -> None:
        self.generation_tokens.labels(**self._labels).inc(generated)
        self.success.labels(**self._labels, finished_reason=reason).inc()

    def render(self) -> bytes:
        readings = self._read()
        self.running.labels(**self._labels).set(readings.running)
        self.waiting.labels(**self._labels).set(readings.waiting)
        self.usage.labels(**self._labels).set(readings.kv_cache_usage)
        return generate_latest(self.registry)
