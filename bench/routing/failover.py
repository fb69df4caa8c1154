"""Several gateway replicas under load: what their decision-sharing channel costs, and
`--kill-replica`: one replica killed under load and replaced, as a Deployment replaces a
crashed pod (its replacement on the same port bootstraps its index from a surviving
replica). The load generator balances as a Service with readiness probes does.

From the client's records: requests lost on the killed replica, requests failed on the
survivors (target 0), how long the replacement took to be ready, and how it routes in its
first `WINDOW_S` and afterwards beside the survivors (target: within 2 hit-rate points and
10 % TTFT p90 after `WINDOW_S`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bench.harness.readiness import eventually, wait_http
from bench.harness.streaming import RequestRecord
from bench.results_io import percentile
from bench.routing.routers import RouterProcess

WINDOW_S = 10.0
"""The replacement must route as well as the others this long after it was started."""


@dataclass(slots=True)
class ReplicaKill:
    """When (perf_counter, shared by every process on this machine) it happened."""

    url: str = ""
    killed_after_requests: int = 0
    killed_at: float = math.nan
    restarted_at: float = math.nan
    ready_at: float = math.nan
    victim_cpu_s: float = 0.0
    """The killed process's CPU time, counted in the run's router CPU."""


async def kill_and_replace(
    client: httpx.AsyncClient, routers: list[RouterProcess], requests: int, kill: ReplicaKill
) -> None:
    """Kill `routers[0]` once a third of `requests` were answered; start its replacement
    (in `routers[0]`'s place, so the run stops it) and wait until it is ready."""

    async def a_third_answered() -> bool:
        return await _answered(client, routers) >= requests / 3

    await eventually(a_third_answered, "a third of the requests answered", 3600.0, 0.1)
    victim, peer = routers[0], routers[1]
    kill.url = victim.url
    kill.killed_after_requests = await _answered(client, routers)
    kill.victim_cpu_s = victim.cpu_seconds(with_children=True) or 0.0
    kill.killed_at = time.perf_counter()
    await victim.kill()
    log = victim.log_path.with_name(victim.log_path.stem + "-replacement.log")
    env = {**victim.env, "KVGATE_BOOTSTRAP_PEER": peer.url}
    replacement = RouterProcess(
        victim.name, victim.command, log, victim.port, env, victim.admin_token
    )
    routers[0] = replacement
    kill.restarted_at = time.perf_counter()
    await replacement.start()
    await wait_http(f"{replacement.url}/ready", replacement, timeout_s=60, interval_s=0.05)
    kill.ready_at = time.perf_counter()


def failover_figures(
    records: Sequence[RequestRecord], kill: ReplicaKill, scale_ms: float
) -> dict[str, Any]:
    """The kill's figures from the client's records (latencies in model ms)."""
    if not kill.url:
        return {"killed": False}
    victim = [r for r in records if r.router_url == kill.url]
    survivors = [r for r in records if r.router_url != kill.url]
    ready_at = kill.ready_at if math.isfinite(kill.ready_at) else math.inf  # not in time
    lost = [r for r in victim if r.error is not None and r.started < ready_at]
    early = (kill.restarted_at, kill.restarted_at + WINDOW_S)
    late = (kill.restarted_at + WINDOW_S, math.inf)
    return {
        "killed": True,
        "killed_after_requests": kill.killed_after_requests,
        "lost_on_killed": len(lost),
        "failed_on_survivors": sum(r.error is not None for r in survivors),
        "failed_on_replacement": sum(r.error is not None for r in victim if r.started >= ready_at),
        "replacement_ready_s": kill.ready_at - kill.restarted_at,
        "down_s": kill.ready_at - kill.killed_at,
        "replacement": {
            "first_10s": _window(victim, early, scale_ms),
            "after_10s": _window(victim, late, scale_ms),
        },
        "survivors": {
            "first_10s": _window(survivors, early, scale_ms),
            "after_10s": _window(survivors, late, scale_ms),
        },
    }


def failover_targets(label: str, figures: dict[str, Any]) -> list[str]:
    """The issue's targets for a replica killed under load, ✓ / ✗."""
    if not figures.get("killed"):
        return []
    mine, theirs = figures["replacement"]["after_10s"], figures["survivors"]["after_10s"]
    lines = [
        _target(
            figures["failed_on_survivors"] == 0,
            f"{label}, a replica killed: 0 requests failed on the others "
            f"({figures['failed_on_survivors']}; {figures['lost_on_killed']} lost on it)",
        )
    ]
    if mine["requests"] and theirs["requests"]:
        close = (
            mine["hit_rate"] >= theirs["hit_rate"] - 0.02
            and mine["ttft_p90_ms"] <= theirs["ttft_p90_ms"] * 1.10
        )
        lines.append(
            _target(
                close,
                f"{label}, its replacement {WINDOW_S:.0f} s after start routes as well as the "
                f"others (hit {mine['hit_rate']:.1%} vs {theirs['hit_rate']:.1%}, TTFT p90 "
                f"{mine['ttft_p90_ms']:.0f} vs {theirs['ttft_p90_ms']:.0f} ms; ready in "
                f"{figures['replacement_ready_s']:.1f} s)",
            )
        )
    else:
        lines.append(f"  ? {label}: too few requests after {WINDOW_S:.0f} s to compare")
    return lines


def channel_target(label: str, share: float | None) -> list[str]:
    """The sharing channel's CPU against the issue's 10 % of the replicas' CPU."""
    if share is None:
        return []
    return [_target(share <= 0.10, f"{label}: the sharing channel uses {share:.1%} of the "
                    "replicas' CPU (≤ 10 %)")]  # fmt: skip


def _window(
    records: Sequence[RequestRecord], span: tuple[float, float], scale_ms: float
) -> dict[str, float]:
    start, end = span
    inside = [r for r in records if start <= r.started < end and r.error is None]
    prompt = sum(r.prompt_tokens for r in inside)
    ttfts = [r.ttft_s * scale_ms for r in inside if r.ttft_s is not None]
    return {
        "requests": len(inside),
        "hit_rate": sum(r.cached_tokens for r in inside) / prompt if prompt else math.nan,
        "ttft_p90_ms": percentile(ttfts, 90) if ttfts else math.nan,
    }


def _target(ok: bool, text: str) -> str:
    return f"  {'✓' if ok else '✗'} {text}"


async def sync_cpu_share(
    client: httpx.AsyncClient, routers: Sequence[RouterProcess]
) -> float | None:
    """What the decision-sharing channel costs: its CPU over the replicas' whole CPU."""
    channel = await _metric_sum(client, routers, "kvgate_replica_sync_cpu_seconds_total")
    whole = await _metric_sum(client, routers, "process_cpu_seconds_total")
    return channel / whole if whole > 0 else None


async def _answered(client: httpx.AsyncClient, routers: Sequence[RouterProcess]) -> int:
    """Requests the live replicas have answered so far (their `kvgate_requests_total`)."""
    return int(await _metric_sum(client, routers, "kvgate_requests_total"))


async def _metric_sum(
    client: httpx.AsyncClient, routers: Sequence[RouterProcess], name: str
) -> float:
    """The sum of every sample of `name` on the live replicas' /metrics pages."""
    total = 0.0
    for router in routers:
        try:
            page = (await client.get(f"{router.url}/metrics", timeout=2.0)).text
        except httpx.HTTPError:
            continue
        total += sum(
            float(line.rsplit(" ", 1)[1])
            for line in page.splitlines()
            if line.startswith((name + "{", name + " "))
        )
    return total
