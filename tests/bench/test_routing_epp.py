"""`kvgate bench routing --mode`: kvgate's policies through the proxy and through the
endpoint picker (`kvgate epp`, the load generator playing Envoy), side by side."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.routing.report import epp_targets
from bench.routing.runner import RoutingOptions, _runs
from bench.routing.summary import RunResult
from bench.routing.workloads import WorkloadSize


def _result(via: str, p90_ms: float, hit: float) -> RunResult:
    latency = {"p50": p90_ms / 2, "p90": p90_ms, "p99": 2 * p90_ms, "mean": p90_ms / 2}
    return RunResult("chat", "prefix-cache", 0.8, 10.0, 100, 0, latency, latency, latency, 9.0,
                     90.0, hit, hit, {"e0": 1.0}, 1.0, via=via)  # fmt: skip


def test_the_picker_is_judged_against_the_proxy_by_hit_rate_and_spread() -> None:
    proxy, picked = _result("proxy", 200.0, 0.60), _result("epp", 230.0, 0.585)
    assert picked.label == "prefix-cache@epp" and proxy.label == "prefix-cache"
    assert picked.as_json()["label"] == "prefix-cache@epp"
    spreads = {"prefix-cache": {"ttft_p90": [180.0, 240.0]},
               "prefix-cache@epp": {"ttft_p90": [210.0, 250.0]}}  # fmt: skip
    lines = epp_targets([proxy, picked], spreads)
    assert lines == [
        "  ✓ prefix-cache@epp: hit rate within 2 points of the proxy's: 58.5% vs 60.0% "
        "(-1.5 points)",
        "  ✓ prefix-cache@epp: TTFT p90 the proxy's within the spread (the rounds' ranges "
        "overlap): 230 (210–250) vs 200 (180–240) ms",
    ]
    far = dataclasses.replace(picked, hit_rate=0.55)
    apart = {**spreads, "prefix-cache@epp": {"ttft_p90": [245.0, 300.0]}}
    assert [line[:3] for line in epp_targets([proxy, far], apart)] == ["  ✗", "  ✗"]
    one_round = epp_targets([proxy, picked])
    assert one_round[1] == ("  · prefix-cache@epp: TTFT p90 230 vs the proxy's 200 ms "
                            "(one round: no spread to judge it by)")  # fmt: skip


def test_each_kvgate_policy_runs_in_each_mode_the_others_as_proxies() -> None:
    options = RoutingOptions(
        workloads=["chat"], routers=["prefix-cache", "oracle"], engines=2, loads=[0.8],
        mode="open", concurrency=0, size=WorkloadSize(), time_scale=None, seed=0,
        out_dir=Path("unused"), replicas=[(1, False), (2, True)], vias=("proxy", "epp"),
    )  # fmt: skip
    assert _runs(options) == [
        ("prefix-cache", (1, False), "proxy"),
        ("prefix-cache", (2, True), "proxy"),
        ("prefix-cache", (1, False), "epp"),  # the picker as one replica
        ("oracle", (1, False), "proxy"),
    ]


def test_a_tiny_run_in_both_modes_routes_through_the_picker_to_the_pods(
    tmp_path: Path,
) -> None:
    command = [
        sys.executable, "-m", "gateway.cli", "bench", "routing", "--quick", "--engines", "2",
        "--workloads", "chat", "--routers", "prefix-cache", "--mode", "proxy,epp",
        "--time-scale", "4", "--keep-records", "--out", str(tmp_path), "--quiet",
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    document = json.loads((tmp_path / "routing.json").read_text())
    runs = {run["label"]: run for run in document["runs"]}
    assert set(runs) == {"prefix-cache", "prefix-cache@epp"}
    assert runs["prefix-cache@epp"]["via"] == "epp" and runs["prefix-cache"]["via"] == "proxy"
    picks = runs["prefix-cache@epp"]["pick_ms"]
    assert 0 < picks["p50"] <= picks["p90"] < runs["prefix-cache@epp"]["ttft_ms"]["p99"]
    assert runs["prefix-cache"]["pick_ms"] == {}  # the proxy's decision is not apart
    expected = document["fleets"]["chat"]["requests"]
    for run in runs.values():
        assert run["requests"] == expected and run["errors"] == 0
        assert run["hit_rate"] > 0  # the engines' own counters: reported for both
        assert sum(run["engine_share"].values()) == pytest.approx(1.0)
    logs = tmp_path / "logs" / "chat"
    pods = json.loads((logs / "pods.json").read_text())["pods"]
    endpoints = {pod["url"].removeprefix("http://") for pod in pods}
    (kept,) = logs.glob("load-prefix-cache@epp-*.records.json")
    records = json.loads(kept.read_text())
    assert len(records) == expected
    assert all(r["status"] == 200 and r["error"] is None for r in records)
    assert {r["pod"] for r in records} <= endpoints  # answered by the picked pods
    assert all(0 < r["pick_s"] < r["ttft_s"] for r in records)
    assert (logs / "router-prefix-cache-epp.log").exists()
    for label in runs:
        assert f"\n{label} " in out.stdout  # a row of the table each
    assert "prefix-cache@epp: hit rate within 2 points of the proxy's" in out.stdout


def test_an_unknown_mode_is_refused_before_anything_starts(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "gateway.cli", "bench", "routing", "--quick",
               "--mode", "sidecar", "--out", str(tmp_path / "run")]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "choose from proxy, epp" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "run").exists()
