"""docs/metrics.md against a live gateway's /metrics page: every exposed kvgate family is
documented with its type, every documented one is exposed, every label seen is listed."""

from __future__ import annotations

import re
from pathlib import Path

from tests.gateway.conftest import MODEL, StartGateway

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(kvgate_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|")
SAMPLE = re.compile(r"^(kvgate_[a-z0-9_]+?)(_bucket|_sum|_count)?(\{[^}]*\})? ")


def documented() -> dict[str, tuple[str, set[str]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, kind, labels = match.groups()
            rows[name] = (kind, set(re.findall(r"`(\w+)`", labels)))
    return rows


def exposed(page: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(type per family, label names seen per family) of the page's kvgate families."""
    types = {}
    for line in page.splitlines():
        match = re.match(r"# TYPE (kvgate_\S+) (\S+)", line)
        if match and not match.group(1).endswith("_created"):
            types[match.group(1)] = match.group(2)
    labels: dict[str, set[str]] = {name: set() for name in types}
    for line in page.splitlines():
        match = SAMPLE.match(line)
        if match is None:
            continue
        name = match.group(1) if match.group(1) in types else match.group(1) + "_total"
        if name in labels:
            seen = set(re.findall(r'(\w+)="', match.group(3) or "")) - {"le"}
            labels[name] |= seen
    return types, labels


async def test_every_metric_on_a_live_page_is_documented_and_nothing_else(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2)
    async with gw.client() as client:
        for i in range(3):  # labelled families get samples
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": 2,
                "stream": True,
            }
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        await client.post("/v1/chat/completions", json={"model": "no-such-model", "messages": []})
        page = (await client.get("/metrics")).text
    for per_model in ("kvgate_time_to_first_byte_seconds", "kvgate_request_duration_seconds"):
        assert f'{per_model}_count{{model="{MODEL}"}} 3.0' in page, per_model
    for standard in ("process_resident_memory_bytes", "process_open_fds", "python_info"):
        assert f"\n{standard}" in page, standard  # what any Python service's page has
    types, labels = exposed(page)
    doc = documented()
    assert len(doc) > 40
    assert sorted(set(types) - set(doc)) == [], "exposed but not in docs/metrics.md"
    assert sorted(set(doc) - set(types)) == [], "in docs/metrics.md but not exposed"
    for name, kind in types.items():
        assert doc[name][0] == kind, name
        assert labels[name] <= doc[name][1], (name, labels[name])
