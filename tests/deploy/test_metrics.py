"""The gateway's real /metrics page (a gateway in front of simulated engines, after real
traffic) passes `promtool check metrics`, and every metric the Grafana dashboard queries
is on it."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.support import (
    DEPLOY,
    exposed_sample_names,
    promql_metric_names,
    promtool,
)
from tests.gateway.conftest import MODEL, StartGateway
from tests.helpers import eventually

DASHBOARD = DEPLOY / "observability" / "grafana-dashboard.json"
PROCESS = ("process_cpu_seconds_total", "process_resident_memory_bytes")
"""Standard process metrics the gateway exports (prometheus_client's process collector),
which the dashboard reads for the gateway's CPU and memory."""


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query the dashboard runs, its variable included."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # Grafana's label_values(METRIC, LABEL): the selector is the PromQL part.
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["definition"])
            assert match, variable["definition"]
            queries.append((f"variable {variable['name']}", match.group(1)))
    return queries


def require_promtool() -> str:
    found = promtool()
    if found is None:
        pytest.skip("promtool not found (Debian package `prometheus`; scripts/test.sh installs it)")
    return found


async def live_metrics_page(start_gateway: StartGateway) -> str:
    """/metrics of a gateway that has routed a request and subscribed to both engines."""
    gw = await start_gateway(2)
    async with gw.client() as client:

        async def subscribed() -> bool:
            page = (await client.get("/metrics")).text
            return page.count("kvgate_subscriber_connected{") == 2

        await eventually(subscribed, what="both subscribers connected")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        page = await client.get("/metrics")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/plain")
    return page.text


async def test_live_metrics_page_passes_promtool(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    tool = require_promtool()
    page = await live_metrics_page(start_gateway)
    assert "kvgate_requests_total{" in page  # the request really is counted
    process = await asyncio.create_subprocess_exec(
        tool, "check", "metrics", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(page.encode()), timeout=30)
    assert process.returncode == 0, f"promtool check metrics:\n{output.decode()}"


def test_promtool_check_metrics_does_reject_a_bad_page() -> None:
    tool = require_promtool()
    bad = '# TYPE kvgate_requests counter\nkvgate_requests{pod="a"} 1\n'  # no _total
    result = subprocess.run(
        [tool, "check", "metrics"], input=bad, capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0


async def test_every_dashboard_metric_is_exported(start_gateway: StartGateway) -> None:
    page = await live_metrics_page(start_gateway)
    exposed = exposed_sample_names(list(text_string_to_metric_families(page)))
    missing: dict[str, list[str]] = {}
    used: set[str] = set()
    for title, expr in dashboard_queries():
        names = promql_metric_names(expr)
        assert names, f"{title}: no metric found in {expr!r}"
        for name in names:
            assert name.startswith("kvgate_") or name in PROCESS, f"{title}: {name} is not ours"
            used.add(name)
            if name not in exposed:
                missing.setdefault(name, []).append(title)
    assert not missing, f"dashboard queries metrics the gateway does not export: {missing}"
    # Each area the dashboard is for has its panel.
    for prefix in ("kvgate_requests_total", "kvgate_decision_seconds_bucket",
                   "kvgate_matched_blocks_total", "kvgate_inflight_requests",
                   "kvgate_subscriber_replays_total", "kvgate_index_size",
                   "kvgate_pins_active", "kvgate_time_to_first_byte_seconds_bucket",
                   "kvgate_request_duration_seconds_bucket", "kvgate_prompt_tokens_total",
                   "kvgate_completion_tokens_total", "kvgate_pod_unindexable",
                   *PROCESS):  # fmt: skip
        assert prefix in used


def test_metric_name_extraction() -> None:
    """The PromQL reader used above finds selectors, not functions, labels or keywords."""
    expr = (
        "histogram_quantile(0.99, sum by (le, stage) (rate(kvgate_decision_seconds_bucket"
        '{namespace=~"$namespace", stage="total"}[$__rate_interval])))'
        " / on (pod) group_left sum without (x) (kvgate_inflight_requests offset 5m)"
        " and kvgate_index_size or vector(1) > bool 2 unless kvgate:recorded:rule"
    )
    assert promql_metric_names(expr) == {
        "kvgate_decision_seconds_bucket",
        "kvgate_inflight_requests",
        "kvgate_index_size",
        "kvgate:recorded:rule",
    }


def test_dashboard_queries_parse_as_promql(tmp_path: Path) -> None:
    """promtool parses each panel query (as a recording rule; Grafana's variables filled in)."""
    tool = require_promtool()
    rules: list[dict[str, Any]] = []
    for number, (_, expr) in enumerate(dashboard_queries()):
        filled = expr.replace("$__rate_interval", "5m").replace("$namespace", ".*")
        rules.append({"record": f"kvgate:dashboard_query:{number}", "expr": filled})
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
