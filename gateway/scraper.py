"""Engine load and health from each pod's /metrics, scraped on a timer."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import httpx

from gateway.registry import PodRegistry, PodState

logger = logging.getLogger(__name__)

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


def parse_engine_metrics(text: str) -> dict[str, float]:
    """The load gauges of a Prometheus text page, summed over label sets (DP ranks).

    A plain line scan: a full exposition parser costs milliseconds per page, too much for
    every pod every second.
    """
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        name_end = brace if 0 <= brace < space or space < 0 else space
        field = _GAUGES.get(line[:name_end])
        if field is None:
            continue
        rest = line[line.rfind("}") + 1 :] if brace == name_end else line[name_end:]
        try:
            value = float(rest.split()[0])  # a timestamp may follow the value
        except (IndexError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        if field == "kv_usage":
            found[field] = max(found.get(field, 0.0), value)
        else:
            found[field] = found.get(field, 0.0) + value
    return found


class MetricsScraper:
    """Every `interval_s`, reads every pod's /metrics: load gauges and health.

    Any HTTP answer below 500 counts as alive (an engine started without metrics answers
    404); `unhealthy_after` consecutive failures mark the pod unhealthy, one success heals.
    Each pod is scraped by its own task, and each exchange (connect, headers, body) has one
    deadline: an engine that trickles its page a byte at a time fails its own scrape in
    time and delays no other pod's health.
    """

    def __init__(
        self,
        registry: PodRegistry,
        client: httpx.AsyncClient,
        *,
        interval_s: float,
        unhealthy_after: int,
        on_scrape: Callable[[PodState, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._client = client
        self._interval_s = interval_s
        self._unhealthy_after = unhealthy_after
        self._on_scrape = on_scrape
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
        deadline = max(0.2, min(self._interval_s, 2.0))
        try:
            async with asyncio.timeout(deadline):  # the whole exchange, not each read
                response = await self._client.get(f"{state.pod.url}/metrics", timeout=deadline)
            ok = response.status_code < 500
            gauges = parse_engine_metrics(response.text) if response.status_code == 200 else {}
        except (httpx.HTTPError, TimeoutError):
            ok, gauges = False, {}
        if ok:
            if not state.healthy:
                logger.info("pod %s is healthy again", state.name)
            state.healthy = True
            state.failed_scrapes = 0
            state.scraped_at = self._clock()
            state.running = gauges.get("running", 0.0)
            state.waiting = gauges.get("waiting", 0.0)
            state.kv_usage = gauges.get("kv_usage", 0.0)
        else:
            state.failed_scrapes += 1
            if state.healthy and state.failed_scrapes >= self._unhealthy_after:
                logger.warning("pod %s is unhealthy: /metrics failed %d times", state.name,
                               state.failed_scrapes)  # fmt: skip
                state.healthy = False
        if self._on_scrape is not None:
            self._on_scrape(state, ok)
