"""A real Prometheus (Debian's `prometheus` package, which scripts/test.sh installs with
promtool) scrapes a live gateway in front of simulated engines through mixed traffic and
an engine failure; every dashboard query is then evaluated through Prometheus's HTTP API,
and every alerting rule (deploy/observability/kvgate-rules.yml) must have run cleanly.
Each must be valid PromQL that Prometheus runs, and each panel must show data, or be in
`EMPTY_HERE` with the reason this traffic cannot give it any. The engine's failure is a
first burst of errors on series the gateway exported at 0: "Errors by engine pod" shows it
in `rate()`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.test_alerts import RULES, rules
from tests.deploy.test_metrics import DASHBOARD
from tests.gateway.conftest import MODEL, StartGateway, pod_entry
from tests.helpers import eventually, free_port

EMPTY_HERE = {
    "Pin calls": "no conversation is pinned here: pinning needs SGLang's pin API (the "
    "simulator's sglang flavour; tests/gateway/test_pin*, kvgate bench pin-depth)",
}
"""Panels this traffic cannot fill, and why (an entry with an empty reason is not one)."""


@contextlib.asynccontextmanager
async def prometheus(tmp_path: Path, target: str) -> AsyncIterator[httpx.AsyncClient]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(
            "prometheus not found (Debian package `prometheus`; scripts/test.sh installs it)"
        )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        "  - job_name: kvgate\n"
        f"    static_configs: [{{targets: ['{target}'], labels: {{namespace: kvgate}}}}]\n"
    )
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            async def ready() -> bool:
                try:
                    return (await client.get("/-/ready")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, within=30, what="prometheus ready")
            yield client
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 20)
        except TimeoutError:
            process.kill()
            await process.wait()


async def query(client: httpx.AsyncClient, expr: str) -> list[Any]:
    answer = (await client.get("/api/v1/query", params={"query": expr})).json()
    assert answer["status"] == "success", (expr, answer)
    result: list[Any] = answer["data"]["result"]
    return result


def panels() -> list[tuple[str, list[str]]]:
    """(title, queries) of every panel, Grafana's variables filled in as it would."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        exprs = [
            target["expr"].replace("$namespace", "kvgate").replace("$__rate_interval", "1m")
            for target in panel.get("targets", [])
        ]
        if exprs:
            found.append((panel["title"], exprs))
    return found


async def test_every_dashboard_query_runs_on_a_real_prometheus(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    snapshots = tmp_path / "snapshots"
    first = await start_gateway(engines=2, snapshot_dir=snapshots, snapshot_interval_s=0.2)
    async with first.client() as client:
        body = {"model": MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": "remember me " * 40}]}  # fmt: skip
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    await first.server.stop()  # a clean shutdown writes each pod's snapshot...
    assert list(snapshots.iterdir())  # ...which the next gateway restores
    gw = await start_gateway(
        engines=0, pods=[pod_entry(engine) for engine in first.engines],
        snapshot_dir=snapshots, scrape_interval_s=0.2, unhealthy_after=2,
    )  # fmt: skip
    target = gw.url.removeprefix("http://")
    async with prometheus(tmp_path, target) as prom, gw.client() as client:
        system = {"role": "system", "content": "You answer briefly. " * 30}
        for i in range(12):
            body = {"model": MODEL, "stream": True, "max_tokens": 3, "messages": [
                system, {"role": "user", "content": f"question {i} " * 10}]}  # fmt: skip
            slo = {"x-slo-ttft-ms": "60000" if i % 2 else "0.001",  # met / missed
                   "x-slo-tpot-ms": "60000" if i % 3 else "0.001"}  # fmt: skip
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=slo
            ) as response:
                await response.aread()
            await client.post("/v1/chat/completions", json={**body, "model": "no-such-model"})

        async def scraped(times: int) -> bool:
            samples = await query(prom, 'count_over_time(up{job="kvgate"}[5m])')
            return bool(samples) and float(samples[0]["value"][1]) >= times

        # Prometheus has seen the failing pod's error series at 0 before their first burst
        await eventually(lambda: scraped(2), within=40, what="two scrapes before the failure")
        before = await query(prom, 'kvgate_upstream_errors_total{pod="e1",kind="connect"}')
        assert [float(sample["value"][1]) for sample in before] == [0.0]
        await first.engines[1].stop()  # an engine fails: health, retries, 502/503s
        for i in range(6):  # round-robin: at once, before health checks take it out of
            await client.post("/v1/chat/completions", json={  # the ranking, half go there
                "model": MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": f"after {i}"}]},
                headers={"x-kvgate-policy": "round-robin"})  # fmt: skip

        await eventually(lambda: scraped(8), within=40, what="eight scrapes")
        empty = []
        errors_by_pod: dict[str, float] = {}
        for title, exprs in panels():
            results = [await query(prom, expr) for expr in exprs]  # each one valid and run
            if not any(results):
                empty.append(title)
            if title == "Errors by engine pod":
                for sample in (sample for result in results for sample in result):
                    pod = sample["metric"]["pod"]
                    value = float(sample["value"][1])
                    errors_by_pod[pod] = errors_by_pod.get(pod, 0.0) + value
        evaluated = (await prom.get("/api/v1/rules")).json()["data"]["groups"]
    loaded = [rule for group in evaluated for rule in group["rules"]]
    assert sorted(rule["name"] for rule in loaded) == sorted(rule["alert"] for rule in rules())
    failing = [(rule["name"], rule.get("lastError")) for rule in loaded if rule["health"] != "ok"]
    assert failing == []  # every alert ran on this gateway's series without an error
    assert errors_by_pod.get("e1", 0.0) > 0, errors_by_pod  # the first burst, in rate()
    assert errors_by_pod.get("e0") == 0.0, errors_by_pod  # exported, and at 0
    unexplained = [title for title in empty if not EMPTY_HERE.get(title)]
    assert unexplained == [], f"panels without data and without a reason: {unexplained}"
