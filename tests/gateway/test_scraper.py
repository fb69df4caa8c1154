"""Engine /metrics: the line parser, and the scraper against real simulated engines."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from gateway.control.discovery import Pod
from gateway.control.registry import PodRegistry, PodState
from gateway.upstream.scraper import MAX_PAGE_BYTES, MetricsScraper, parse_engine_metrics
from indexer import SyncPrefixHashTable
from simulator import EngineServer
from tests.conftest import StartEngine
from tests.gateway.conftest import StartGateway, pod_entry
from tests.helpers import eventually, free_port

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "vllm-0.32.0-cpu-metrics.txt"
MODEL = "sim-model"

# -- parse_engine_metrics -------------------------------------------------------------------


def test_the_real_vllm_page() -> None:
    text = GOLDEN.read_text()
    # What the golden page holds: an idle engine.
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0' in text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0' in text
    assert parse_engine_metrics(text) == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}


def test_the_real_vllm_page_with_load() -> None:
    labels = '{engine="0",model_name="tiny"}'
    text = GOLDEN.read_text()
    for name, value in (
        ("vllm:num_requests_running", "3.0"),
        ("vllm:num_requests_waiting", "7.0"),
        ("vllm:kv_cache_usage_perc", "0.42"),
    ):
        line = f"{name}{labels} 0.0"
        assert line in text
        text = text.replace(line, f"{name}{labels} {value}")
    # num_requests_waiting_by_reason shares a prefix with num_requests_waiting: not counted.
    text = text.replace('reason="capacity"} 0.0', 'reason="capacity"} 99.0')
    assert parse_engine_metrics(text) == {"running": 3.0, "waiting": 7.0, "kv_usage": 0.42}


def test_sglang_names() -> None:
    text = "\n".join(
        [
            "# HELP sglang:num_running_reqs The number of running requests.",
            "# TYPE sglang:num_running_reqs gauge",
            'sglang:num_running_reqs{model_name="m",tp_rank="0"} 2.0',
            "# TYPE sglang:num_queue_reqs gauge",
            'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 5.0',
            "# TYPE sglang:token_usage gauge",
            'sglang:token_usage{model_name="m",tp_rank="0"} 0.25',
            'sglang:gen_throughput{model_name="m",tp_rank="0"} 1234.5',
        ]
    )
    assert parse_engine_metrics(text) == {"running": 2.0, "waiting": 5.0, "kv_usage": 0.25}


def test_data_parallel_ranks_are_summed_and_usage_is_the_fullest() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 4.0',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7',
        ]
    )
    assert parse_engine_metrics(text) == {"running": 5.0, "waiting": 5.0, "kv_usage": 0.7}


def test_older_vllm_names_and_unlabelled_samples() -> None:
    text = "vllm:num_requests_running 4\nvllm:gpu_cache_usage_perc 0.5\n"
    assert parse_engine_metrics(text) == {"running": 4.0, "kv_usage": 0.5}


def test_label_values_with_spaces_and_braces() -> None:
    text = 'vllm:num_requests_running{model_name="my model {v2}"} 6.0'
    assert parse_engine_metrics(text) == {"running": 6.0}


def test_garbage_lines_are_skipped() -> None:
    text = "\n".join(
        [
            "",
            "   ",
            "#",
            "# vllm:num_requests_running 100",
            "garbage",
            "vllm:num_requests_running",  # no value
            "vllm:num_requests_runnin",
            'vllm:num_requests_running{engine="0"} not-a-number',
            "vllm:num_requests_running{",
            "{} 3",
            "vllm:num_requests_waiting_total 9",
            "\x00\xff binary",
            'vllm:num_requests_waiting{engine="0"} 2.0',  # the one good line
            "vllm:kv_cache_usage_perc",
        ]
    )
    assert parse_engine_metrics(text) == {"waiting": 2.0}
    assert parse_engine_metrics("") == {}
    assert parse_engine_metrics("<html>502 Bad Gateway</html>") == {}


def test_a_sample_with_a_timestamp() -> None:
    text = 'vllm:num_requests_running{engine="0"} 2.0 1700000000000'
    assert parse_engine_metrics(text) == {"running": 2.0}


# -- MetricsScraper against real engines ----------------------------------------------------


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def registry() -> PodRegistry:
    return PodRegistry(table=SyncPrefixHashTable(), subscribers=None)


async def add(reg: PodRegistry, server: EngineServer, *, url: str | None = None) -> PodState:
    name = server.engine.config.name
    await reg.upsert_pod(Pod(name=name, url=url or server.url, model=MODEL))
    state = reg.get(name)
    assert state is not None
    return state


def scraper(
    reg: PodRegistry,
    client: httpx.AsyncClient,
    *,
    unhealthy_after: int = 2,
    on_scrape: Callable[[PodState, bool], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    interval_s: float = 0.05,
) -> MetricsScraper:
    return MetricsScraper(
        reg,
        client,
        interval_s=interval_s,
        unhealthy_after=unhealthy_after,
        on_scrape=on_scrape,
        clock=clock,
    )


async def test_gauges_are_read_from_a_busy_engine(
    start_engine: StartEngine, client: httpx.AsyncClient
) -> None:
    server = await start_engine(name="busy", max_batch=1)
    reg = registry()
    state = await add(reg, server)
    seen: list[tuple[str, bool]] = []
    ticks = iter(range(1000))
    metrics = scraper(
        reg,
        client,
        on_scrape=lambda s, ok: seen.append((s.name, ok)),
        clock=lambda: float(next(ticks)),
    )

    await metrics.scrape_all()
    assert (state.running, state.waiting, state.kv_usage) == (0.0, 0.0, 0.0)
    assert state.healthy and state.scraped_at == 0.0
    assert seen == [("busy", True)]

    # One engine step stalls for 2 s: one request runs, two wait, while we scrape.
    armed = await client.post(f"{server.url}/sim/faults", json={"stall_ms": 2000, "seconds": 0.5})
    assert armed.status_code == 200
    body = {"model": MODEL, "prompt": "tell me a long story " * 8, "max_tokens": 4}
    requests = [
        asyncio.create_task(client.post(f"{server.url}/v1/completions", json=body, timeout=30))
        for _ in range(3)
    ]
    try:
        scheduler = server.engine.scheduler
        await eventually(
            lambda: len(scheduler.running) == 1 and len(scheduler.waiting) == 2,
            what="one running, two waiting",
        )
        await metrics.scrape_all()
        assert state.running == 1.0
        assert state.waiting == 2.0
        engine = server.engine
        assert state.kv_usage == pytest.approx(engine.cache.gpu_used / engine.config.gpu_blocks)
        assert state.kv_usage > 0.0
        assert state.scraped_at == 1.0
    finally:
        responses = await asyncio.gather(*requests)
    assert all(response.status_code == 200 for response in responses)


async def test_a_stopped_engine_turns_unhealthy_and_heals_when_back(
    start_engine: StartEngine, client: httpx.AsyncClient
) -> None:
    first = await start_engine(name="flaky")
    reg = registry()
    state = await add(reg, first)
    port, url = first.port, first.url
    seen: list[bool] = []
    metrics = scraper(reg, client, unhealthy_after=3, on_scrape=lambda _s, ok: seen.append(ok))

    await metrics.scrape_all()
    assert state.healthy and state.failed_scrapes == 0

    await first.stop()
    for failures in (1, 2):
        await metrics.scrape_all()
        assert state.failed_scrapes == failures
        assert state.healthy  # not yet: fewer than unhealthy_after failures
        assert reg.routable() == [state]
    assert reg.routable_serving(MODEL) == ((state,), ("flaky",))  # cached for the model
    await metrics.scrape_all()
    assert state.failed_scrapes == 3
    assert not state.healthy
    assert reg.routable() == []
    assert reg.routable_serving(MODEL) == ((), ())  # the health change dropped the cache
    assert reg.serving(MODEL) == [state]
    await metrics.scrape_all()
    assert not state.healthy and state.failed_scrapes == 4

    second = await start_engine(name="flaky", port=port)
    assert second.url == url
    await metrics.scrape_all()
    assert state.healthy
    assert state.failed_scrapes == 0
    assert reg.routable() == [state]
    assert reg.routable_serving(MODEL) == ((state,), ("flaky",))
    await reg.upsert_pod(Pod(name="flaky", url=url, model=MODEL, ready=False))
    assert reg.routable_serving(MODEL) == ((), ())  # not Ready (discovery): kept, not routed
    assert seen == [True, False, False, False, False, True]


async def test_the_scrape_loop_marks_and_heals_pods(
    start_engine: StartEngine, client: httpx.AsyncClient
) -> None:
    first = await start_engine(name="loop-a")
    steady = await start_engine(name="loop-b")
    reg = registry()
    state = await add(reg, first)
    other = await add(reg, steady)
    port = first.port
    scrapes: list[str] = []
    metrics = scraper(reg, client, on_scrape=lambda s, _ok: scrapes.append(s.name))
    task = asyncio.create_task(metrics.run())
    try:
        await eventually(lambda: scrapes.count("loop-a") >= 2, what="scrapes")
        assert state.healthy and other.healthy
        await first.stop()
        await eventually(lambda: not state.healthy, what="stopped engine unhealthy")
        assert other.healthy
        await start_engine(name="loop-a", port=port)
        await eventually(lambda: state.healthy, what="restarted engine healthy")
        assert other.healthy
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_answer_without_metrics_counts_as_alive(
    start_engine: StartEngine, client: httpx.AsyncClient
) -> None:
    server = await start_engine(name="nometrics")
    # A base URL whose /metrics is a 404 on a live server: an engine run without metrics.
    reg = registry()
    state = await add(reg, server, url=f"{server.url}/no-such-prefix")
    state.running, state.waiting, state.kv_usage = 5.0, 5.0, 0.5
    state.failed_scrapes = 2
    metrics = scraper(reg, client)
    await metrics.scrape_all()
    assert state.healthy
    assert state.failed_scrapes == 0
    assert (state.running, state.waiting, state.kv_usage) == (0.0, 0.0, 0.0)


async def test_a_pod_that_never_answered_becomes_unhealthy(client: httpx.AsyncClient) -> None:
    reg = registry()
    await reg.upsert_pod(Pod(name="ghost", url=f"http://127.0.0.1:{free_port()}", model=MODEL))
    state = reg.get("ghost")
    assert state is not None
    metrics = scraper(reg, client, unhealthy_after=1)
    await metrics.scrape_all()
    assert not state.healthy
    assert state.scraped_at is None


async def test_an_empty_registry_is_fine(client: httpx.AsyncClient) -> None:
    await scraper(registry(), client).scrape_all()


async def test_a_trickling_engine_fails_its_own_scrapes_and_delays_no_other(
    start_engine: StartEngine, client: httpx.AsyncClient
) -> None:
    """An engine whose /metrics trickles a byte every 0.1 s (each read well within any
    per-read timeout) is marked unhealthy by the deadline on the whole exchange, while the
    healthy pod keeps being scraped every interval."""

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"#" * 100_000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
        writer.close()

    slow = await asyncio.start_server(trickle, "127.0.0.1", 0)
    healthy = await start_engine(name="healthy")
    reg = registry()
    await reg.upsert_pod(Pod(name="slow", url=f"http://127.0.0.1:{slow.sockets[0].getsockname()[1]}",
                             model=MODEL))  # fmt: skip
    fine = await add(reg, healthy)
    scrapes: list[tuple[str, bool, float]] = []
    metrics = MetricsScraper(
        reg, client, interval_s=0.2, unhealthy_after=2,
        on_scrape=lambda s, ok: scrapes.append((s.name, ok, time.monotonic())),
    )  # fmt: skip
    task = asyncio.create_task(metrics.run())
    try:
        await eventually(lambda: not reg.get("slow").healthy, within=5.0, what="slow unhealthy")

        def fine_times() -> list[float]:
            return [at for name, ok, at in scrapes if name == "healthy" and ok]

        await eventually(lambda: len(fine_times()) >= 8, within=5.0, what="healthy scrapes")
        gaps = [b - a for a, b in itertools.pairwise(fine_times())]
        assert max(gaps) < 1.0  # a bound: the slow pod never holds the healthy one back
        assert fine.healthy
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        slow.close()
        await slow.wait_closed()


# -- a page's size and the event loop -------------------------------------------------------


class MetricsPage:
    """A raw HTTP engine whose /metrics is `page`, sent with a content-length or chunked
    (64 KB chunks, no length declared); anything else is a 404."""

    def __init__(self, page: bytes, *, chunked: bool = False) -> None:
        self.page = page
        self.chunked = chunked
        self.server: asyncio.Server | None = None
        self.handlers: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"GET /metrics "):
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                elif self.chunked:
                    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    view = memoryview(self.page)
                    for at in range(0, len(view), 65536):
                        part = view[at : at + 65536]
                        writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(self.page))
                    writer.write(self.page)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await self.server.wait_closed()


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def failures(page: str, pod: str, reason: str) -> float:
    prefix = f'kvgate_scrape_failures_total{{pod="{pod}",reason="{reason}"}} '
    (line,) = [line for line in page.splitlines() if line.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
async def test_a_10_mb_metrics_page_fails_its_scrape_without_stalling_the_gateway(
    start_gateway: StartGateway, chunked: bool
) -> None:
    """A pod serving a 10 MB /metrics page (its length declared, or chunked and only
    found out by reading): its scrapes fail, counted as too_large, and it turns unhealthy,
    while the gateway's event loop never stalls for long, its memory stays bounded and the
    other pod is scraped as usual."""
    line = b'vllm:num_requests_running{engine="0",model_name="tiny",pad="' + b"x" * 60 + b'"} 1.0\n'
    huge = line * (10 * 1024 * 1024 // len(line))
    async with MetricsPage(huge, chunked=chunked) as url:
        gw = await start_gateway(engines=1, unhealthy_after=2)
        gw.write_pods([pod_entry(gw.engines[0]), {"name": "big", "url": url, "model": MODEL}])
        baseline = rss_bytes()
        worst_gap = 0.0
        peak = baseline

        async def ticker() -> None:
            # A stall is the loop's thread busy between two ticks (its CPU time): on a
            # loaded machine the OS may also keep it off the CPU for a while, which is no
            # work of the gateway's and is not counted.
            nonlocal worst_gap, peak
            last = time.thread_time()
            while True:
                await asyncio.sleep(0.005)
                now = time.thread_time()
                worst_gap = max(worst_gap, now - last)
                peak = max(peak, rss_bytes())
                last = now

        watch = asyncio.create_task(ticker())
        try:
            async with gw.client() as client:

                async def big_failed_thrice() -> bool:
                    page = (await client.get("/metrics")).text
                    counted = 'big",reason="too_large"' in page
                    return counted and failures(page, "big", "too_large") >= 3

                await eventually(big_failed_thrice, within=20, what="three failed scrapes")
                page = (await client.get("/metrics")).text
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
    big = gw.state.registry.get("big")
    assert big is not None and not big.healthy and big.running == 0.0
    e0 = gw.state.registry.get("e0")
    assert e0 is not None and e0.healthy
    for reason in ("unreachable", "timeout", "status"):
        assert failures(page, "big", reason) == 0
    assert failures(page, "e0", "too_large") == 0  # at 0 from the pod's first scrape
    assert 'kvgate_pod_healthy{pod="big"} 0.0' in page
    assert worst_gap < 0.25, f"the event loop was busy {worst_gap:.3f} s at a stretch"
    assert peak - baseline < 48 * 1024 * 1024, f"+{(peak - baseline) / 2**20:.0f} MB resident"


async def test_a_page_up_to_the_bound_is_read_and_parsed_as_the_same_text(
    client: httpx.AsyncClient,
) -> None:
    """The real vLLM page, streamed chunked, gives what the parser gives for its text; a
    page of exactly MAX_PAGE_BYTES is read, one byte more fails the scrape."""
    text = GOLDEN.read_text().replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 5.0',
    )
    reg = registry()
    async with MetricsPage(text.encode(), chunked=True) as url:
        await reg.upsert_pod(Pod(name="golden", url=url, model=MODEL))
        state = reg.get("golden")
        assert state is not None
        await scraper(reg, client).scrape_all()
        assert state.healthy and state.scraped_at is not None
        assert (state.running, state.waiting, state.kv_usage) == (0.0, 5.0, 0.0)
        assert parse_engine_metrics(text) == {"running": 0.0, "waiting": 5.0, "kv_usage": 0.0}
    sample = b"vllm:num_requests_running 2.0\n"
    padding = b"#" * (MAX_PAGE_BYTES - len(sample) - 1) + b"\n"
    for page, ok in ((sample + padding, True), (sample + padding + b"#", False)):
        for chunked in (False, True):
            reg = registry()
            seen: list[bool] = []
            async with MetricsPage(page, chunked=chunked) as url:
                await reg.upsert_pod(Pod(name="edge", url=url, model=MODEL))
                # A 4 MiB page within the longest scrape deadline (2 s), not the 0.2 s of
                # the other tests: this one is about the size bound, not about time.
                await scraper(reg, client, on_scrape=lambda _, ok, seen=seen: seen.append(ok),
                              interval_s=2.0).scrape_all()  # fmt: skip
            state = reg.get("edge")
            assert state is not None
            assert seen == [ok], (len(page), chunked)
            assert state.running == (2.0 if ok else 0.0)
