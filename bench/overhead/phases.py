"""The measured phases: cases compared direct vs via the gateway (or the relay), the
closed loop behind them, the throughput run, and the figures each one yields."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.harness.fleet import MODEL
from bench.overhead.channels import CHAT_PATH, PATH, ChannelFactory, Timing
from bench.overhead.fleet import Fleet
from bench.results_io import percentile

WARM_UP = 10
CPU_RUN_MIN_REQUESTS = 500
"""At least this many requests in a run measuring CPU per request: /proc counts a
process's CPU in 10 ms ticks."""
_PROMPT = "You are a helpful assistant. Say hello to the user in one short word please."
_SYSTEM = " ".join(
    f"Rule {i}: answer questions about the prefix cache of the gateway briefly, cite the "
    f"section {i * 7} of the manual, and never invent a block hash."
    for i in range(16)
)
"""A chat case's system prompt (~2,300 characters, ~500 tokens): what a chat request's
tokenization renders and encodes every time."""


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
    """Through the gateway, the gateway tokenizing in-process ("gateway-local"), the byte
    relay ("relay") or a peer router (its name)."""
    chat: bool = False
    """Chat completions (a system prompt and a question), else completions."""

    @property
    def path(self) -> str:
        return CHAT_PATH if self.chat else PATH


@dataclass
class Bodies:
    """Request bodies; distinct prompts never repeat, across sides and cases."""

    counter: Iterator[int] = field(default_factory=itertools.count)

    def next(self, case: Case) -> bytes:
        prompt = f"Request {next(self.counter)}. {_PROMPT}" if case.distinct else _PROMPT
        body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        if case.chat:
            messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
            body = {"model": MODEL, "messages": messages, "max_tokens": 1}
        if case.stream:
            body.update(max_tokens=4, stream=True)
        return json.dumps(body).encode()


@dataclass
class Comparison:
    direct: list[Timing] = field(default_factory=list)
    gateway: list[Timing] = field(default_factory=list)
    gateway_cpu_s: float = 0.0
    """CPU the gateway process used while its measured requests ran."""
    interleaved_cpu_s: float | None = None
    """At concurrency 1: its CPU over the alternating loop, where it also follows the KV
    events of the direct requests (`gateway_cpu_s` is then from requests of its own)."""
    cpu_requests: int = 0
    """The requests `gateway_cpu_s` covers (0: the measured ones)."""
    engines_cpu_s: float | None = None
    """At concurrency 1: the engines' CPU over the same run (what a remote tokenizer costs
    them shows here)."""
    cpu_run_statuses: Counter[str] = field(default_factory=Counter)
    """Non-200 answers in the run of the gateway's requests alone."""

    @property
    def errors(self) -> int:
        return sum(t.status != 200 for t in (*self.direct, *self.gateway)) + sum(
            self.cpu_run_statuses.values()
        )


async def compare_c1(case: Case, fleet: Fleet, new: ChannelFactory, bodies: Bodies) -> Comparison:
    """Direct and gateway requests alternate one by one, so drift affects both alike.

    The CPU per request comes from a run of the gateway's requests alone afterwards (half
    as many, at least `CPU_RUN_MIN_REQUESTS`): in the alternating loop a gateway following
    the engines' KV events also pays for the events of the direct requests, which with
    distinct prompts is a batch per request that never went through it. That loop's
    figure is kept as `interleaved`."""
    urls = fleet.engine_urls[:1] if case.via == "relay" else fleet.engine_urls
    engines = [new(url) for url in urls]
    gateway = new(fleet.url(case.via))
    result = Comparison()
    cpu_before = 0.0
    try:
        for i in range(case.requests + WARM_UP):
            if i == WARM_UP:
                cpu_before = fleet.cpu_s(case.via)
            direct = await engines[i % len(engines)].post(bodies.next(case), case.policy, case.path)
            via = await gateway.post(bodies.next(case), case.policy, case.path)
            if i >= WARM_UP:
                result.direct.append(direct)
                result.gateway.append(via)
        result.interleaved_cpu_s = fleet.cpu_s(case.via) - cpu_before
        result.cpu_requests = max(CPU_RUN_MIN_REQUESTS, case.requests // 2)
        cpu_before = fleet.cpu_s(case.via)
        engines_before = fleet.engines_cpu_s()
        for _ in range(result.cpu_requests):
            alone = await gateway.post(bodies.next(case), case.policy, case.path)
            if alone.status != 200:
                result.cpu_run_statuses[str(alone.status)] += 1
        result.gateway_cpu_s = fleet.cpu_s(case.via) - cpu_before
        result.engines_cpu_s = fleet.engines_cpu_s() - engines_before
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
    gateway_urls = [fleet.url(case.via)] * case.concurrency
    for block in range(rounds + 1):
        direct = await closed_loop(case, direct_urls, new, bodies, count=per_block)
        cpu_before = fleet.cpu_s(case.via)
        via = await closed_loop(case, gateway_urls, new, bodies, count=per_block)
        if block:
            result.direct.extend(direct)
            result.gateway.extend(via)
            result.gateway_cpu_s += fleet.cpu_s(case.via) - cpu_before
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
                timings.append(await channel.post(bodies.next(case), case.policy, case.path))
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
        figures[f"{side}_error_statuses"] = dict(_statuses(timings))
        figures[f"{side}_p50_ms"] = _ms([t.total_s for t in timings], 50)
        figures[f"{side}_cpu_cores"] = {n: round(s / elapsed, 2) for n, s in cpu.items()}
        figures[f"{side}_cpu_us_per_request"] = {
            n: round(s / max(1, ok) * 1e6) for n, s in cpu.items()
        }
    return figures


def _ms(values: list[float], pct: float) -> float:
    return round(percentile(values, pct) * 1e3, 3)


def _statuses(timings: list[Timing]) -> Counter[str]:
    """How many answers had each non-200 status."""
    return Counter(str(t.status) for t in timings if t.status != 200)


def measured(case: Case, timings: list[Timing]) -> list[float]:
    return [t.first_s if case.stream else t.total_s for t in timings]


def summarise(case: Case, comparison: Comparison) -> dict[str, Any]:
    direct = measured(case, comparison.direct)
    gateway = measured(case, comparison.gateway)
    figures: dict[str, Any] = {
        "policy": case.policy,
        "concurrency": case.concurrency,
        "distinct_prompts": case.distinct,
        "stream": case.stream,
        "via": case.via,
        "requests": len(direct),
        "errors": comparison.errors,
        "error_statuses": dict(
            _statuses([*comparison.direct, *comparison.gateway]) + comparison.cpu_run_statuses
        ),
    }
    for pct in (50, 99):
        figures[f"direct_p{pct}_ms"] = _ms(direct, pct)
        figures[f"gateway_p{pct}_ms"] = _ms(gateway, pct)
        figures[f"added_p{pct}_ms"] = round(_ms(gateway, pct) - _ms(direct, pct), 3)
    cpu_requests = comparison.cpu_requests or len(gateway)
    figures["gateway_cpu_us_per_request"] = round(comparison.gateway_cpu_s / cpu_requests * 1e6)
    if comparison.engines_cpu_s is not None:
        figures["engines_cpu_us_per_request"] = round(comparison.engines_cpu_s / cpu_requests * 1e6)
    if comparison.interleaved_cpu_s is not None:
        figures["gateway_cpu_us_per_request_interleaved"] = round(
            comparison.interleaved_cpu_s / len(gateway) * 1e6
        )
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
