"""The measured phases: publishing (live and burst), index checks, gaps and the overrun."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.results_io import percentile
from bench.subscriber_load.engines import CATCH_UP_TIMEOUT_S, EngineProcess
from bench.subscriber_load.gateway import Gateway

OVERRUN_CHURN_S = 1.0


async def publishing(
    gateway: Gateway,
    engines: list[EngineProcess],
    command: tuple[Any, ...],
    prefix: str,
    *,
    steady: bool,
    timeout_s: float = CATCH_UP_TIMEOUT_S,
) -> dict[str, Any]:
    """Run `command` on every engine at once; measure what the subscriber applied meanwhile.

    The window runs from the first send until the subscriber has applied every batch.
    Rates are over the whole window, or with `steady` over its middle only (the first 20 %
    and the last 10 % left out).
    """
    cpu_before = time.process_time()
    applied_before = gateway.sink.totals()
    reports = await asyncio.gather(*(e.ask(*command, timeout_s=timeout_s) for e in engines))
    await asyncio.gather(
        *(gateway.wait_seq(e.name, r["last_seq"]) for e, r in zip(engines, reports, strict=True))
    )
    cpu_s = time.process_time() - cpu_before
    start = min(r["started_at"] for r in reports)
    published_end = max(r["ended_at"] for r in reports)
    caught_up = max(gateway.sink.counts[e.name].last_applied_at for e in engines)
    span = caught_up - start
    applied = [
        now - before for now, before in zip(gateway.sink.totals(), applied_before, strict=True)
    ]
    if steady:
        rates = _rates(gateway, start + 0.2 * span, caught_up - 0.1 * span)
    else:
        rates = dict(zip(("batches", "events", "blocks"), (n / span for n in applied), strict=True))
    published = {k: sum(r[k] for r in reports) for k in ("batches", "events", "blocks")}
    return {
        **{f"{prefix}_{name}_per_s": value for name, value in rates.items()},
        f"{prefix}_events_per_cpu_s": applied[1] / cpu_s,
        f"{prefix}_cpu_s": cpu_s,
        f"{prefix}_wall_s": span,
        f"{prefix}_publish_s": published_end - start,
        f"{prefix}_first_percent_applied_s": _first_percent_at(
            gateway, start, applied_before[0], applied[0]
        ),
        f"{prefix}_published": published,
        f"{prefix}_event_loop_max_stall_ms": gateway.max_lag_ms(start, caught_up + 0.05),
        f"{prefix}_pod_caught_up_s": {
            e.name: gateway.sink.counts[e.name].last_applied_at - start for e in engines
        },
        f"{prefix}_applied": dict(zip(("batches", "events", "blocks"), applied, strict=True)),
    }


def _first_percent_at(gateway: Gateway, start: float, before: int, batches: int) -> float:
    """Seconds from `start` until 1 % of the phase's batches had been applied."""
    for sample in gateway.sink.samples:
        at = sample.at + gateway.t0
        if at >= start and sample.totals[0] - before >= batches / 100:
            return at - start
    return float("nan")


def _rates(gateway: Gateway, start: float, end: float) -> dict[str, float]:
    """Batches, events and blocks applied per second over [start, end] (monotonic times)."""
    window = [s for s in gateway.sink.samples if start <= s.at + gateway.t0 <= end]
    if len(window) < 2:
        raise RuntimeError("the measured window holds < 2 samples: publish longer or more")
    first, last = window[0], window[-1]
    span = last.at - first.at
    return {
        name: (last.totals[i] - first.totals[i]) / span
        for i, name in enumerate(("batches", "events", "blocks"))
    }


async def check_equal(gateway: Gateway, engines: list[EngineProcess]) -> dict[str, Any]:
    """Ask every engine what it holds (after the subscriber caught up) and diff the index."""
    stale = missing = resident = 0
    for engine in engines:
        state = await engine.ask("resident")
        await gateway.wait_seq(engine.name, state["last_seq"])
        pod_stale, pod_missing = gateway.diff(engine.name, state["resident"])
        stale += pod_stale
        missing += pod_missing
        resident += len(state["resident"])
    return {
        "equal": stale == missing == 0,
        "stale": stale,
        "missing": missing,
        "resident": resident,
    }


async def gap_phase(
    gateway: Gateway, engines: list[EngineProcess], rounds: int, drops: int
) -> dict[str, Any]:
    """Drop `drops` batches from PUB, publish one more, time until the index caught up."""
    recoveries: list[float] = []
    consistent = True
    for index in range(rounds):
        engine = engines[index % len(engines)]
        before = gateway.manager.status(engine.name)
        answer = await engine.ask("gap", drops)
        await gateway.wait_seq(engine.name, answer["seq"])
        recovered_at = gateway.sink.counts[engine.name].last_applied_at
        recoveries.append((recovered_at - answer["sent_at"]) * 1e3)
        gateway.marks.append((answer["sent_at"] - gateway.t0, recoveries[-1]))
        after = gateway.manager.status(engine.name)
        state = await engine.ask("resident")
        stale, missing = gateway.diff(engine.name, state["resident"])
        replayed = (
            before is not None
            and after is not None
            and after.replays > before.replays
            and after.gaps > before.gaps
        )
        consistent = consistent and replayed and stale == missing == 0
        await asyncio.sleep(0.05)
    return {
        "gap_recovery_ms": recoveries,
        "gap_recovery_p50_ms": percentile(recoveries, 50),
        "gap_recovery_max_ms": max(recoveries),
        "gap_rounds_consistent": consistent,
    }


async def overrun_phase(gateway: Gateway, engine: EngineProcess, drops: int) -> dict[str, Any]:
    """A gap longer than the engine's replay buffer: reset, rebuild from what it has.

    Then the engine keeps serving for a while: how much of what it holds does the index
    learn again from new events alone?
    """
    await gateway.manager.upsert(engine.endpoint)
    try:
        await gateway.wait_live(engine.name)
        for _ in range(20):  # some history, which a reset must not leave behind
            answer = await engine.ask("gap", 0)
            await gateway.wait_seq(engine.name, answer["seq"])
        answer = await engine.ask("gap", drops)
        await gateway.wait_seq(engine.name, answer["seq"])
        recovered_at = gateway.sink.counts[engine.name].last_applied_at
        status = gateway.manager.status(engine.name)
        state = await engine.ask("resident")
        stale, missing = gateway.diff(engine.name, state["resident"])
        results = {
            "overrun_recovery_ms": (recovered_at - answer["sent_at"]) * 1e3,
            "overrun_stale_blocks": stale,
            "overrun_missing_blocks": missing,
            "overrun_engine_blocks": len(state["resident"]),
            "overrun_degraded_reason": status.degraded_reason if status else None,
            "overrun_whole": status.whole if status else None,
        }
        return {**results, **await _after_overrun(gateway, engine)}
    finally:
        await gateway.manager.remove(engine.name)


async def _after_overrun(gateway: Gateway, engine: EngineProcess) -> dict[str, Any]:
    broken_before = gateway.table.stats().rejected_blocks.get("broken_chain", 0)
    report = await engine.ask("live", OVERRUN_CHURN_S)
    await gateway.wait_seq(engine.name, report["last_seq"])
    state = await engine.ask("resident")
    stale, missing = gateway.diff(engine.name, state["resident"])
    broken = gateway.table.stats().rejected_blocks.get("broken_chain", 0) - broken_before
    return {
        "overrun_churn_batches": report["batches"],
        "overrun_churn_blocks_published": report["blocks"],
        "overrun_churn_broken_chain_blocks": broken,
        "overrun_stale_after_churn": stale,
        "overrun_missing_after_churn": missing,
        "overrun_engine_blocks_after_churn": len(state["resident"]),
    }


def subscriber_counters(gateway: Gateway, pods: list[str]) -> dict[str, int]:
    statuses = [gateway.manager.status(pod) for pod in pods]
    present = [s for s in statuses if s is not None]
    return {
        name: sum(getattr(s, name) for s in present)
        for name in ("batches_applied", "replays", "gaps", "restarts", "live_dropped")
    }
