"""The routing benchmark's tables, each from a kept run folder under bench/results/routing/.

Rounds of a `--repeat` run are shown as their median with the range over the rounds; TTFT
is in model ms (simulated engines) or real ms (real vLLM engines), as the run reports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.routing.routers import KVGATE_POLICIES
from bench.tables.markdown import num, pct, spread, table

Run = dict[str, Any]
Figure = Callable[[Run], float]


def runs(results: Path, folder: str) -> list[Run]:
    document = json.loads((results / "routing" / folder / "routing.json").read_text())
    found: list[Run] = document["runs"]
    return found


def label(run: Run) -> str:
    """The router as the run's report names it (replicas: `×3`, `×3 indep.`; through the
    endpoint picker: `@epp`)."""
    via = run.get("via", "proxy")
    name = f"`{run['router']}`" if via == "proxy" else f"`{run['router']}@{via}`"
    if run.get("replicas", 1) == 1:
        return name
    return f"{name} ×{run['replicas']}" + ("" if run["replica_sync"] else " indep.")


def groups(found: Sequence[Run]) -> list[tuple[str, str, list[Run]]]:
    """(workload, router label, its rounds), in the run's order."""
    grouped: dict[tuple[str, str], list[Run]] = {}
    for run in found:
        grouped.setdefault((run["workload"], label(run)), []).append(run)
    return [(workload, name, rounds) for (workload, name), rounds in grouped.items()]


def cell(rounds: Sequence[Run], figure: Figure, fmt: Callable[[float], str] = num) -> str:
    return spread([figure(run) for run in rounds], fmt)


def ttft(p: str) -> Figure:
    return lambda run: float(run["ttft_ms"][p])


def tag_p90(tag: str) -> Figure:
    return lambda run: float(run["by_tag"][tag]["ttft_p90"])


def hit(run: Run) -> float:
    return float(run["hit_rate"])


def error_p90(run: Run) -> float:
    return float(run["prediction"].get("rel_err_p90", float("nan")))


def _pct(value: float) -> str:
    return pct(value)


def workloads(results: Path) -> str:
    """The default (`prefix-cache`) only: the run's other profiles were variants of it."""
    rows = [
        (workload, router, cell(r, ttft("p50")), cell(r, ttft("p90")), cell(r, ttft("p99")),
         cell(r, hit, _pct), cell(r, error_p90, lambda v: pct(v, 0)))
        for workload, router, r in groups(runs(results, "workloads"))
        if router == "`prefix-cache`"
    ]  # fmt: skip
    head = ["workload", "router", "TTFT p50", "TTFT p90", "TTFT p99", "hit rate"]
    return table([*head, "prediction \\|error\\| p90"], rows)


def vip_flood(results: Path) -> str:
    rows = [
        (router, cell(r, ttft("p90")), cell(r, ttft("p99")), cell(r, tag_p90("vip")),
         cell(r, tag_p90("flood")), cell(r, hit, _pct))
        for _, router, r in groups(runs(results, "vip-flood"))
    ]  # fmt: skip
    return table(["router", "TTFT p90", "TTFT p99", "VIP p90", "flood p90", "hit rate"], rows)


def closed(results: Path) -> str:
    rows = []
    for folder in ("closed-vip-flood", "closed-hetero"):
        document = json.loads((results / "routing" / folder / "routing.json").read_text())
        users = document["options"]["concurrency"]
        for workload, router, r in groups(document["runs"]):
            if router.strip("`") not in KVGATE_POLICIES:  # a variant the run explored
                continue
            vip = cell(r, tag_p90("vip")) if "vip" in r[0]["by_tag"] else "—"
            rows.append((
                f"{workload}, {users} users", router, cell(r, ttft("p90")),
                cell(r, ttft("p99")), vip, cell(r, hit, _pct),
            ))  # fmt: skip
    return table(["workload", "router", "TTFT p90", "TTFT p99", "VIP p90", "hit rate"], rows)


def _least_share(run: Run) -> float:
    shares = run["engine_prompt_share"]
    return float(min(shares.values())) if shares else 0.0


def _trace(folder: str) -> Callable[[Path], str]:
    def render(results: Path) -> str:
        rows = [
            (router, cell(r, ttft("p50")), cell(r, ttft("p90")), cell(r, ttft("p99")),
             cell(r, hit, _pct), cell(r, tag_p90("long")), cell(r, tag_p90("mid")),
             cell(r, tag_p90("short")), cell(r, _least_share, _pct))
            for _, router, r in groups(runs(results, folder))
        ]  # fmt: skip
        head = ["router", "TTFT p50", "p90", "p99", "hit rate", "p90 long", "p90 mid"]
        return table([*head, "p90 short", "least engine's prompt share"], rows)

    return render


traces_conversation = _trace("traces-conversation")
traces_synthetic = _trace("traces-synthetic")

_FLEETS = (
    ("chat-vllm-fleet", "vLLM, `/tokenize` (vLLM's takes chats)"),
    ("chat-sglang-fleet", "SGLang, in-process"),
    ("chat-sglang-fleet-remote-tokenizer", "SGLang, `KVGATE_TOKENIZER=remote`"),
)


def engines(results: Path) -> str:
    rows = []
    for folder, fleet in _FLEETS:
        by_router = {router: r for _, router, r in groups(runs(results, folder))}
        kv, rr = by_router["`prefix-cache`"], by_router["`round-robin`"]
        rows.append((
            fleet, cell(kv, hit, _pct), cell(kv, ttft("p90")),
            cell(rr, hit, _pct), cell(rr, ttft("p90")),
        ))  # fmt: skip
    head = ["fleet, kvgate's tokenizer", "prefix-cache hit rate", "prefix-cache TTFT p90"]
    return table([*head, "round-robin hit rate", "round-robin TTFT p90"], rows)


def _busiest(run: Run) -> float:
    return float(max(run["engine_share"].values()))


def real_vllm(results: Path) -> str:
    """One row per router, one column per workload: TTFT p90, hit rate and the busiest
    engine's share of the requests."""
    by_router: dict[str, dict[str, list[Run]]] = {}
    for workload, router, rounds in groups(runs(results, "real-vllm")):
        by_router.setdefault(router, {})[workload] = rounds
    workloads = list(dict.fromkeys(w for cells in by_router.values() for w in cells))
    rows = []
    for router, cells in by_router.items():
        rows.append((router, *(
            f"{cell(cells[w], ttft('p90'))}; {cell(cells[w], hit, _pct)}; "
            f"{cell(cells[w], _busiest, lambda v: pct(v, 0))}" if w in cells else "—"
            for w in workloads
        )))  # fmt: skip
    return table(["router", *(f"`{w}`" for w in workloads)], rows)


def replicas(results: Path) -> str:
    rows = []
    for workload, router, r in groups(runs(results, "replicas")):
        share = r[0]["replica_sync_cpu_share"]
        rows.append((
            f"{workload} ({r[0]['requests']:,} requests)", router, cell(r, hit, _pct),
            f"{cell(r, ttft('p50'))} / {cell(r, ttft('p90'))} / {cell(r, ttft('p99'))}",
            num(r[0]["router_cpu_ms_per_request"], 1), "—" if share is None else pct(share),
        ))  # fmt: skip
    head = ["workload", "replicas", "hit rate", "TTFT p50 / p90 / p99"]
    return table([*head, "router CPU ms / request", "sync channel's CPU share"], rows)


def _window(kill: dict[str, Any], window: str) -> str:
    new, old = kill["replacement"][window], kill["survivors"][window]
    return (
        f"{pct(new['hit_rate'])} vs {pct(old['hit_rate'])}, "
        f"{num(new['ttft_p90_ms'])} vs {num(old['ttft_p90_ms'])} ms"
    )


def replica_kill(results: Path) -> str:
    rows = []
    for run in runs(results, "replica-kill"):
        kill = run["replica_kill"]
        rows.append((
            f"{run['workload']} ({run['requests']:,} requests)", str(kill["lost_on_killed"]),
            str(kill["failed_on_survivors"] + kill["failed_on_replacement"]),
            f"{kill['replacement_ready_s']:.1f} s", _window(kill, "first_10s"),
            _window(kill, "after_10s"),
        ))  # fmt: skip
    head = ["workload", "lost on the killed replica", "failed elsewhere", "replacement ready"]
    window = "replacement vs survivors: hit rate, TTFT p90"
    return table([*head, f"{window}, first 10 s", "after 10 s"], rows)
