"""Engine load and health from each pod's /metrics, scraped on a timer."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import httpx
from prometheus_client import Counter

from gateway.control.registry import PodRegistry, PodState
from gateway.observability.children import Children

logger = logging.getLogger(__name__)

FAILURE_REASONS = ("unreachable", "timeout", "status", "too_large")
# Over loopback compression saves nothing, and inflating a page would happen on the loop.
_IDENTITY = {"accept-encoding": "identity"}

# metric name -> PodState field; vLLM names (old and new) and SGLang's.
_GAUGES: dict[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "kv_usage",
}


MAX_PAGE_BYTES = 4 * 1024 * 1024
"""The largest /metrics page read. A vLLM page is about 50 KB (one engine, one model,
`tests/golden/`); data-parallel ranks and LoRA adapters multiply it by tens at most. A
larger page fails its scrape (`kvgate_scrape_failures_total{reason="too_large"}`) and is
not read past this bound."""


class PageTooLarge(Exception):
    """A pod's /metrics page is over `MAX_PAGE_BYTES`."""


def parse_engine_metrics(text: str) -> dict[str, float]:
    """The load gauges of a Prometheus text page, summed over label sets (DP ranks).

    Each gauge's samples are found by searching for its name at the start of a line: no
    full exposition parser (milliseconds per page, every pod every second), and no step
    that holds the interpreter long over a large page (this runs in a worker thread, next
    to the event loop).
    """
    found: dict[str, float] = {}
    for name, field in _GAUGES.items():
        at = text.find(name)
        while at >= 0:
            after = at + len(name)
            value = _sample(text, at, after) if at == 0 or text[at - 1] == "\n" else None
            at = text.find(name, after)
            if value is None:
                continue
            if field == "kv_usage":
                found[field] = max(found.get(field, 0.0), value)
            else:
                found[field] = found.get(field, 0.0) + value
    return found


def _sample(text: str, start: int, after: int) -> float | None:
    """The value of the sample whose name spans `text[start:after]`, or None if the line
    is another metric (a longer name) or malformed."""
    end = text.find("\n", after)
    line = text[after : len(text) if end < 0 else end]
    if line[:1] == "{":
        rest = line[line.rfind("}") + 1 :]
    elif line[:1] in (" ", "\t"):
        rest = line
    else:
        return None
    try:
        value = float(rest.split()[0])  # a timestamp may follow the value
    except (IndexError, ValueError):
        return None
    return value if math.isfinite(value) else None


def parse_page(page: bytes) -> dict[str, float]:
    """`parse_engine_metrics` of a page as received (UTF-8)."""
    return parse_engine_metrics(page.decode("utf-8", errors="replace"))


async def read_page(response: httpx.Response, limit: int = MAX_PAGE_BYTES) -> bytes:
    """A streamed response's body, read up to `limit` bytes (PageTooLarge beyond)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PageTooLarge(f"/metrics declares {declared} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise PageTooLarge(f"/metrics is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class MetricsScraper:
    """Every `interval_s`, reads every pod's /metrics: load gauges and health.

    Any HTTP answer below 500 counts as alive (an engine started without metrics answers
    404); `unhealthy_after` consecutive failures mark the pod unhealthy, one success heals.
    Each pod is scraped by its own task, and each exchange (connect, headers, body) has one
    deadline: an engine that trickles its page a byte at a time fails its own scrape in
    time and delays no other pod's health. A page is read up to `MAX_PAGE_BYTES` (beyond,
    the scrape fails) and parsed in a worker thread. Each failure is counted in `failures`
    (`kvgate_scrape_failures_total{pod, reason}`, reasons `FAILURE_REASONS`).
    """

    def __init__(
        self,
        registry: PodRegistry,
        client: httpx.AsyncClient,
        *,
        interval_s: float,
        unhealthy_after: int,
        on_scrape: Callable[[PodState, bool], None] | None = None,
        failures: Children[Counter] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._client = client
        self._interval_s = interval_s
        self._unhealthy_after = unhealthy_after
        self._on_scrape = on_scrape
        self._failures = failures
        self._counted: set[str] = set()
        self._clock = clock

    async def run(self) -> None:
        """One scraping task per pod (started and stopped as pods come and go)."""
        tasks: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                live = {state.name for state in self._registry.all()}
                for name in [name for name, task in tasks.items() if name not in live]:
                    tasks.pop(name).cancel()
                for name in live:
                    task = tasks.get(name)
                    if task is None or task.done():
                        tasks[name] = asyncio.create_task(self._scrape_pod(name),
                                                          name=f"kvgate-scrape-{name}")  # fmt: skip
                self._registry.sync_index_modes()
                await asyncio.sleep(self._interval_s)
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)

    async def _scrape_pod(self, name: str) -> None:
        while (state := self._registry.get(name)) is not None:
            await self._scrape(state)
            await asyncio.sleep(self._interval_s)

    async def scrape_all(self) -> None:
        states = self._registry.all()
        if states:
            await asyncio.gather(*(self._scrape(state) for state in states))

    async def _scrape(self, state: PodState) -> None:
        self._count_from_zero(state.name)
        deadline = max(0.2, min(self._interval_s, 2.0))
        failure: str | None = None
        gauges: dict[str, float] = {}
        try:
            async with asyncio.timeout(deadline):  # the whole exchange, not each read
                async with self._client.stream(
                    "GET", f"{state.pod.url}/metrics", headers=_IDENTITY, timeout=deadline
                ) as response:
                    page = await read_page(response)
            if response.status_code >= 500:
                failure = "status"
            elif response.status_code == 200:
                gauges = await asyncio.to_thread(parse_page, page)  # off the event loop
        except PageTooLarge:
            failure = "too_large"
        except (httpx.TimeoutException, TimeoutError):
            failure = "timeout"
        except httpx.HTTPError:
            failure = "unreachable"
        if failure is None:
            if not state.healthy:
                logger.info("pod %s is healthy again", state.name)
            state.healthy = True
            state.failed_scrapes = 0
            state.scraped_at = self._clock()
            state.running = gauges.get("running", 0.0)
            state.waiting = gauges.get("waiting", 0.0)
            state.kv_usage = gauges.get("kv_usage", 0.0)
        else:
            if self._failures is not None:
                self._failures.labels(state.name, failure).inc()
            state.failed_scrapes += 1
            if state.healthy and state.failed_scrapes >= self._unhealthy_after:
                logger.warning("pod %s is unhealthy: /metrics failed %d times (last: %s)",
                               state.name, state.failed_scrapes, failure)  # fmt: skip
                state.healthy = False
        if self._on_scrape is not None:
            self._on_scrape(state, failure is None)

    def _count_from_zero(self, pod: str) -> None:
        """A pod's failure counters exist at 0 from its first scrape."""
        if self._failures is not None and pod not in self._counted:
            self._counted.add(pod)
            for reason in FAILURE_REASONS:
                self._failures.labels(pod, reason)
