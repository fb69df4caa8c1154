"""kvgate's alerting rules: `promtool check rules` and `promtool test rules` (each alert
fires on the series that should raise it, and only then), the Operator's PrometheusRule
carrying exactly the plain rules file's groups, and every metric an alert reads exported
by a live gateway. The real-Prometheus test (test_prometheus.py) loads the same file and
requires every rule to evaluate without error."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.support import DEPLOY, exposed_sample_names, promql_metric_names
from tests.deploy.test_metrics import live_metrics_page, require_promtool
from tests.gateway.conftest import StartGateway

OBSERVABILITY = DEPLOY / "observability"
RULES = OBSERVABILITY / "kvgate-rules.yml"


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    tool = require_promtool()
    for command in (["check", "rules", str(RULES)], ["test", "rules", "alerts_test.yml"]):
        result = subprocess.run(
            [tool, *command], cwd=OBSERVABILITY, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tested = yaml.safe_load((OBSERVABILITY / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tested
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert {rule["alert"] for rule in rules()} == fired


def test_every_alert_on_a_counter_fires_on_a_first_burst() -> None:
    """A counter alert reads `rate()` or `increase()`: its unit test fires it on the first
    burst of series that start at 0 (as the gateway exports them), and the same burst on
    series that first appear with it (instance b) fires nothing."""
    tested = yaml.safe_load((OBSERVABILITY / "alerts_test.yml").read_text())["tests"]
    bursts = next(test for test in tested if test["name"] == "first bursts")
    fired = {case["alertname"]: case["exp_alerts"] for case in bursts["alert_rule_test"]}
    on_counters = {rule["alert"] for rule in rules()
                   if re.search(r"\b(rate|increase)\(", rule["expr"])}  # fmt: skip
    assert on_counters and on_counters <= {name for name, alerts in fired.items() if alerts}
    for alerts in fired.values():
        assert {alert["exp_labels"]["instance"] for alert in alerts} <= {"a:8080"}
    starts = [(s["series"], s["values"].split()[0]) for s in bursts["input_series"]]
    assert all(first.startswith("0") for name, first in starts if 'instance="a:8080"' in name)
    assert any(first.startswith("_") for name, first in starts if 'instance="b:8080"' in name)


def test_the_prometheus_rule_carries_the_same_groups() -> None:
    operator = yaml.safe_load((OBSERVABILITY / "prometheusrule.yaml").read_text())
    assert operator["kind"] == "PrometheusRule"
    assert operator["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    kustomization = yaml.safe_load((OBSERVABILITY / "kustomization.yaml").read_text())
    assert "prometheusrule.yaml" in kustomization["resources"]


def test_every_alert_has_a_severity_and_says_what_to_do() -> None:
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


async def test_every_metric_an_alert_reads_is_exported(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    page = await live_metrics_page(start_gateway)
    exposed = exposed_sample_names(list(text_string_to_metric_families(page)))
    for rule in rules():
        names = promql_metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exposed, (rule["alert"], names - exposed)
