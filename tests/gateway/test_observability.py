"""Following a request: its id from the client through the gateway's log lines to the
engine and back, JSON and text logs, the access log, `kvgate --version`."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.http.request_id import new_request_id
from gateway.observability.logs import JsonFormatter, TextFormatter
from gateway.upstream.metrics import UPSTREAM_ERROR_KINDS
from gateway.version import VERSION, version
from predictor import FEATURES
from subscriber import DECODE_REASONS, RESET_CAUSES
from tests.conftest import StartEngine
from tests.gateway.conftest import MODEL, StartGateway, pod_entry
from tests.gateway.test_metrics_doc import documented
from tests.helpers import eventually, free_port, kvgate_serve

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}
ROOT = Path(__file__).resolve().parents[2]


class Lines:
    """Log lines as the gateway writes them: a real handler with a real formatter on the
    root logger, at INFO."""

    def __init__(self, formatter: logging.Formatter) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(formatter)

    def text(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def json(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text()]

    async def wait_for(self, predicate: Any, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """The JSON lines matching `predicate`, once there is one (an access line is written
        just after the answer's last byte)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            found = [entry for entry in self.json() if predicate(entry)]
            if found or loop.time() > deadline:
                return found
            await asyncio.sleep(0.01)


@pytest.fixture
def json_lines(caplog: pytest.LogCaptureFixture) -> Iterator[Lines]:
    yield from _capture(caplog, JsonFormatter())


@pytest.fixture
def text_lines(caplog: pytest.LogCaptureFixture) -> Iterator[Lines]:
    yield from _capture(caplog, TextFormatter())


def _capture(caplog: pytest.LogCaptureFixture, formatter: logging.Formatter) -> Iterator[Lines]:
    caplog.set_level(logging.INFO)
    lines = Lines(formatter)
    root = logging.getLogger()
    root.addHandler(lines.handler)
    try:
        yield lines
    finally:
        root.removeHandler(lines.handler)


async def test_the_clients_request_id_reaches_the_engine_and_comes_back(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        response = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"x-request-id": "client-req-1"}
        )
        streamed = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True},
            headers={"x-request-id": "client-req-2"},
        )
    assert response.status_code == 200
    assert response.headers.get_list("x-request-id") == ["client-req-1"]
    assert response.json()["id"] == "chatcmpl-client-req-1"  # vLLM names it after the id
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    assert streamed.headers.get_list("x-request-id") == ["client-req-2"]
    assert list(gw.engines[0].engine.received_request_ids) == ["client-req-1", "client-req-2"]


async def test_pass_through_endpoints_carry_the_request_id(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        embedded = await client.post(
            "/v1/embeddings",
            json={"model": MODEL, "input": "hello"},
            headers={"x-request-id": "emb-1"},
        )
        card = await client.get(f"/v1/models/{MODEL}", headers={"x-request-id": "card-1"})
    assert (embedded.status_code, embedded.headers.get_list("x-request-id")) == (200, ["emb-1"])
    assert (card.status_code, card.headers.get_list("x-request-id")) == (200, ["card-1"])


async def test_a_request_without_an_id_gets_one(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        first = await client.post("/v1/chat/completions", json=CHAT)
        second = await client.post("/v1/chat/completions", json=CHAT)
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", request_id) for request_id in ids)  # uuid4 hex
    assert ids[0] != ids[1]
    assert list(gw.engines[0].engine.received_request_ids) == ids


@pytest.mark.parametrize(
    "given", ["x" * 129, "has space", "semi;colon", 'quote"d', "new\tline", "ünïcode"]
)
async def test_an_unacceptable_id_is_replaced(start_gateway: StartGateway, given: str) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        response = await client.post(
            "/v1/chat/completions", json=CHAT, headers={b"x-request-id": given.encode()}
        )
    assert response.status_code == 200
    made = response.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    assert list(gw.engines[0].engine.received_request_ids) == [made]


async def test_errors_carry_the_request_id(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        unknown_model = await client.post(
            "/v1/chat/completions", json={**CHAT, "model": "nope"}, headers={"x-request-id": "e1"}
        )
        bad_json = await client.post(
            "/v1/chat/completions", content=b"{", headers={"x-request-id": "e2"}
        )
        no_route = await client.get("/v2/nothing", headers={"x-request-id": "e3"})
        unauthorized = await client.get("/admin/pods")
    assert (unknown_model.status_code, unknown_model.headers["x-request-id"]) == (404, "e1")
    assert (bad_json.status_code, bad_json.headers["x-request-id"]) == (400, "e2")
    assert (no_route.status_code, no_route.headers["x-request-id"]) == (404, "e3")
    assert unauthorized.status_code == 401
    assert re.fullmatch(r"[0-9a-f]{32}", unauthorized.headers["x-request-id"])
    assert not gw.engines[0].engine.received_request_ids


async def test_the_admin_decision_record_names_the_request(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=2)
    async with gw.admin() as admin:
        explained = await admin.post("/admin/match", json=CHAT, headers={"x-request-id": "why-1"})
    assert explained.status_code == 200
    assert explained.json()["request_id"] == "why-1"
    assert explained.headers["x-request-id"] == "why-1"


async def test_pin_leases_name_the_request_that_made_them(start_gateway: StartGateway) -> None:
    gw = await start_gateway(1, engine_overrides={"flavor": "sglang"})
    async with gw.admin() as admin:
        made = await admin.post("/admin/pin", json=CHAT, headers={"x-request-id": "pin-1"})
        listed = await admin.get("/admin/pins")
    assert made.status_code == 200, made.text
    assert made.json()["request_id"] == "pin-1"
    assert [lease["request_id"] for lease in listed.json()["pins"]] == ["pin-1"]


async def test_json_lines_follow_a_request_by_its_id(
    start_gateway: StartGateway, json_lines: Lines
) -> None:
    dead = {"name": "dead", "url": "http://127.0.0.1:9", "model": MODEL}  # refuses connections
    gw = await start_gateway(engines=1, unhealthy_after=1000, default_policy="round-robin")
    live = gw.engines[0].engine.config.name
    gw.write_pods([dead, {"name": live, "url": gw.engines[0].url, "model": MODEL}])
    async with gw.client() as client:
        for _ in range(50):  # until the reloaded pods file is seen
            if {state.name for state in gw.state.registry.all()} == {"dead", live}:
                break
            await asyncio.sleep(0.05)
        ids = []
        for n in range(2):  # round-robin: one of the two goes to the dead pod first
            response = await client.post(
                "/v1/chat/completions", json=CHAT, headers={"x-request-id": f"follow-{n}"}
            )
            assert response.status_code == 200
            assert response.headers["x-kvgate-pod"] == live
            ids.append(response.headers["x-request-id"])
    access = await json_lines.wait_for(
        lambda entry: entry["logger"] == "kvgate.access" and entry["request_id"] == "follow-1"
    )
    entries = json_lines.json()
    for entry in entries:
        assert {"time", "level", "logger", "message", "request_id", "pod"} <= entry.keys()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    retried = [entry for entry in entries if entry["logger"] == "gateway.upstream.proxy"]
    assert len(retried) == 1 and "retrying on another pod" in retried[0]["message"]
    assert retried[0]["request_id"] in ids and retried[0]["pod"] == "dead"
    assert retried[0]["level"] == "INFO"
    (line,) = access
    assert line["level"] == "INFO" and line["pod"] == live
    assert line["status"] == 200 and line["method"] == "POST"
    assert line["path"] == "/v1/chat/completions"
    assert line["policy"] == "round-robin"
    assert line["cached_blocks"] == 0
    assert 0 < line["ttft_ms"] <= line["duration_ms"]
    assert list(gw.engines[0].engine.received_request_ids) == ids


async def test_text_lines_have_a_timestamp_and_the_request(
    start_gateway: StartGateway, text_lines: Lines
) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "t-1"})
    pod = gw.engines[0].engine.config.name
    pattern = (
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO kvgate\.access "
        rf"\[request_id=t-1 pod={pod}\]: POST /v1/chat/completions status=200 pod={pod} "
        r"policy=prefix-cache cached_blocks=\d+ ttft_ms=[\d.]+ duration_ms=[\d.]+"
    )
    for _ in range(100):
        if any(re.fullmatch(pattern, line) for line in text_lines.text()):
            break
        await asyncio.sleep(0.01)
    assert any(re.fullmatch(pattern, line) for line in text_lines.text()), text_lines.text()


async def test_probes_are_access_logged_at_debug(
    start_gateway: StartGateway, json_lines: Lines
) -> None:
    gw = await start_gateway(engines=1)
    async with gw.client() as client:
        await client.get("/health", headers={"x-request-id": "probe"})
        await client.get("/v1/models", headers={"x-request-id": "models"})
    assert await json_lines.wait_for(lambda entry: entry["request_id"] == "models")
    assert not [entry for entry in json_lines.json() if entry["request_id"] == "probe"]


async def test_the_access_log_can_be_turned_off(
    start_gateway: StartGateway, json_lines: Lines
) -> None:
    gw = await start_gateway(engines=1, access_log=False)
    async with gw.client() as client:
        response = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"x-request-id": "quiet"}
        )
    assert response.headers["x-request-id"] == "quiet"
    await asyncio.sleep(0.1)
    assert not [entry for entry in json_lines.json() if entry["logger"] == "kvgate.access"]


async def test_the_prediction_log_shows_each_learned_answer_term_by_term(
    start_gateway: StartGateway, json_lines: Lines
) -> None:
    stream = {**CHAT, "stream": True}
    quiet = await start_gateway(engines=1)
    async with quiet.client() as client:
        await client.post("/v1/chat/completions", json=stream, headers={"x-request-id": "p-0"})
    gw = await start_gateway(engines=1, prediction_log=True)
    async with gw.client() as client:
        for n in (1, 2):
            response = await client.post(
                "/v1/chat/completions", json=stream, headers={"x-request-id": f"p-{n}"}
            )
            assert response.status_code == 200
    lines = await json_lines.wait_for(
        lambda entry: entry["logger"] == "kvgate.predictions" and entry["request_id"] == "p-2"
    )
    (line,) = lines
    assert line["pod"] == gw.engines[0].engine.config.name and line["level"] == "INFO"
    assert line["observed_ms"] > 0 and line["predicted_ms"] > 0
    assert set(line["terms_ms"]) == set(FEATURES)
    assert sum(line["terms_ms"].values()) == pytest.approx(line["predicted_ms"], abs=0.01)
    assert line["own_tokens"] > 0 and line["speed"] > 0
    assert f"observed {line['observed_ms']:.1f} ms" in line["message"]
    logged = {e["request_id"] for e in json_lines.json() if e["logger"] == "kvgate.predictions"}
    assert logged == {"p-1", "p-2"}  # off by default: nothing from the first gateway


def test_json_lines_are_one_object_each_even_with_newlines_and_tracebacks() -> None:
    lines = Lines(JsonFormatter())
    logger = logging.getLogger("kvgate.test")
    logger.addHandler(lines.handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("two\nlines")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(lines.handler)
    first, second = lines.json()
    assert first["message"] == "two\nlines" and first["request_id"] is None
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]


def test_line_times_are_utc_with_milliseconds_across_seconds() -> None:
    """The formatters format a second once and reuse it: a line in the next second, or an
    earlier one logged late, still gets its own time."""
    for formatter in (TextFormatter(), JsonFormatter()):
        stamps = []
        for created in (1_700_000_000.25, 1_700_000_000.75, 1_700_000_001.125, 1_699_999_999.5):
            record = logging.LogRecord("kvgate.test", logging.INFO, __file__, 1, "m", None, None)
            record.created, record.msecs = created, (created - int(created)) * 1000
            line = formatter.format(record)
            stamps.append(json.loads(line)["time"] if line.startswith("{") else line.split()[0])
        assert stamps == [
            "2023-11-14T22:13:20.250Z",
            "2023-11-14T22:13:20.750Z",
            "2023-11-14T22:13:21.125Z",
            "2023-11-14T22:13:19.500Z",
        ]


def test_kvgate_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout.strip() == f"kvgate {version()}"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert declared == VERSION  # the fallback constant follows the package's version


async def test_kvgate_serve_json_logs_follow_a_request_to_the_engine(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    """The whole path as deployed: `kvgate serve` with KVGATE_LOG_FORMAT=json, every line of
    its output (uvicorn's included) one JSON object, the request found by its id there and
    at the engine."""
    engine = await start_engine(name="e0")
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [pod_entry(engine)]}))
    log = tmp_path / "gateway.log"
    env = {**os.environ, "KVGATE_LOG_FORMAT": "json", "KVGATE_SCRAPE_INTERVAL": "0.2"}
    async with kvgate_serve(pods, log, env) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]

        def logged() -> bool:
            return f'"request_id": "{request_id}"' in log.read_text(errors="replace")

        await eventually(logged, within=10, what="the access line")
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert {"uvicorn.error", "gateway.lifespan", "kvgate.access"} <= {e["logger"] for e in entries}
    (access,) = [entry for entry in entries if entry["request_id"] == request_id]
    assert access["logger"] == "kvgate.access" and access["status"] == 200
    assert access["pod"] == engine.engine.config.name
    assert request_id in engine.engine.received_request_ids


async def test_metrics_and_admin_on_their_own_port(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    """KVGATE_ADMIN_PORT: /metrics and /admin/* answer there and 404 on the API's port, the
    API 404s on the admin port; probes answer on both."""
    engine = await start_engine(name="e0")
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [pod_entry(engine)]}))
    admin_port = free_port()
    env = {**os.environ, "KVGATE_ADMIN_PORT": str(admin_port), "KVGATE_ADMIN_TOKEN": "t0k"}
    async with (
        kvgate_serve(pods, tmp_path / "gateway.log", env) as api,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin_port}", timeout=10) as admin,
    ):
        token = {"authorization": "Bearer t0k"}
        assert (await api.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await admin.get("/metrics")).status_code == 200
        assert (await admin.get("/admin/pods", headers=token)).status_code == 200
        for path in ("/metrics", "/admin/pods"):
            hidden = await api.get(path, headers=token)
            assert hidden.status_code == 404 and hidden.json()["error"]["message"]
        assert (await admin.post("/v1/chat/completions", json=CHAT)).status_code == 404
        for client in (api, admin):
            assert (await client.get("/ready")).status_code == 200


async def test_token_counters_take_the_engines_usage_or_count_the_stream(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=1)
    completion = {"model": MODEL, "prompt": "one two three four", "max_tokens": 5}
    async with gw.client() as client:
        whole = await client.post("/v1/completions", json=completion)
        told = await client.post(
            "/v1/completions",
            json={**completion, "stream": True, "stream_options": {"include_usage": True}},
        )
        untold = await client.post("/v1/completions", json={**completion, "stream": True})
        refused = await client.post("/v1/completions", json={**completion, "max_tokens": -1})
    assert [whole.status_code, told.status_code, untold.status_code] == [200, 200, 200]
    assert refused.status_code == 400  # the engine refused it: no tokens counted
    usage = whole.json()["usage"]
    streamed_usage = json.loads(told.text.split("data: ")[-2])["usage"]
    assert streamed_usage == usage  # the same prompt and answer length
    events = untold.text.count("data: {")
    assert events == 5  # one token per event

    registry = gw.state.metrics.prometheus

    def tokens(kind: str, source: str) -> float | None:
        value: float | None = registry.get_sample_value(
            f"kvgate_{kind}_tokens_total", {"model": MODEL, "source": source}
        )
        return value

    await eventually(lambda: tokens("completion", "gateway") == events)
    assert tokens("prompt", "engine") == 2 * usage["prompt_tokens"]
    assert tokens("completion", "engine") == 2 * usage["completion_tokens"]
    # The gateway tokenized the prompt itself, so it knows the third one's length too.
    assert tokens("prompt", "gateway") == usage["prompt_tokens"]


def test_made_request_ids_are_uuid4_hex() -> None:
    ids = {new_request_id() for _ in range(2000)}
    assert len(ids) == 2000
    for made in ids:
        parsed = uuid.UUID(hex=made)
        assert parsed.hex == made and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


FORGED = "2026-11-25T07:40:00.123Z WARNING gateway.app: admin token rotated"
"""A line a client would like the gateway's log to hold."""
LINE_START = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
)


async def test_kvgate_serve_text_logs_cannot_be_forged_by_a_path(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    """`kvgate serve` with its default text log: paths holding LF, CR, ESC, a C1 control and
    U+2028 (sent percent-encoded, decoded by the server) are logged on their access line,
    escaped; every line of the output is a record of its own."""
    engine = await start_engine(name="e0")
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [pod_entry(engine)]}))
    log = tmp_path / "gateway.log"
    env = {**os.environ, "KVGATE_SCRAPE_INTERVAL": "0.2"}
    env.pop("KVGATE_LOG_FORMAT", None)
    forged = FORGED.replace(" ", "%20")
    paths = [f"/x%0a{forged}", f"/x%0d{forged}", f"/x%0d%0a{forged}", f"/x%1b[2K%1b[1G{forged}",
             f"/x%c2%85{forged}", f"/x%e2%80%a8{forged}", f"/v1/models/m%0a{forged}"]  # fmt: skip
    async with kvgate_serve(pods, log, env) as client:
        for n, path in enumerate(paths):
            request = client.build_request("GET", path, headers={"x-request-id": f"forge-{n}"})
            response = await client.send(request)
            assert response.status_code == 404, (path, response.text)

        def logged() -> bool:
            return f"request_id=forge-{len(paths) - 1}]" in log.read_text(errors="replace")

        await eventually(logged, within=10, what="the last access line")
    output = log.read_bytes()
    assert b"\r" not in output and b"\x1b" not in output
    assert "\u2028".encode() not in output and "\x85".encode() not in output
    lines = output.decode().split("\n")[:-1]
    assert all(LINE_START.match(line) for line in lines), [
        line for line in lines if not LINE_START.match(line)
    ]
    assert not [line for line in lines if line.startswith(FORGED)]
    for n in range(len(paths)):
        (access,) = [line for line in lines if f"[request_id=forge-{n}]" in line]
        assert "status=404" in access and FORGED in access  # the path is there, escaped
    assert any("GET /x\\n2026" in line for line in lines)
    assert any("GET /x\\x1b[2K\\x1b[1G2026" in line for line in lines)


def test_a_text_traceback_holding_client_data_stays_indented() -> None:
    """An exception's text may quote a client: its lines are escaped and indented under
    the record, never at the start of a line."""
    lines = Lines(TextFormatter())
    logger = logging.getLogger("kvgate.test")
    logger.addHandler(lines.handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("a\nb\rc\x1bd\x7fe\tf")
        try:
            raise ValueError(f"bad value\n{FORGED}\r\x1b[31m")
        except ValueError:
            logger.exception("failed on %s", f"x\n{FORGED}")
    finally:
        logger.removeHandler(lines.handler)
    first, second, *traceback = lines.stream.getvalue().split("\n")[:-1]
    assert first.endswith(": a\\nb\\rc\\x1bd\\x7fe\tf")
    assert second.endswith(f"ERROR kvgate.test: failed on x\\n{FORGED}")
    assert traceback and all(line.startswith("    ") for line in traceback)
    assert f"    {FORGED}\\r\\x1b[31m" in traceback
    assert "    ValueError: bad value" in traceback


async def test_every_pod_and_model_counter_is_at_zero_before_its_first_increment(
    start_gateway: StartGateway,
) -> None:
    """A series that first appears at 5 hides that burst from rate() and increase(): on a
    fresh gateway every counter (and histogram) with a `pod` or `model` label already has
    each known pod's / model's series at 0, and enumerated labels have all their values."""
    gw = await start_gateway(engines=2)
    pods = {"e0", "e1"}
    await eventually(lambda: all(gw.state.registry.subscriber_status(p) for p in pods),
                     what="both pods subscribed")  # fmt: skip
    async with gw.client() as client:
        page = (await client.get("/metrics")).text
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))

    def series(name: str, **labels: str) -> list[float]:
        return [value for found, value in samples.get(name, [])
                if labels.items() <= found.items()]  # fmt: skip

    for name, (kind, labels) in documented().items():
        if kind not in ("counter", "histogram"):
            continue
        sample = name if kind == "counter" else f"{name}_count"
        if "pod" in labels:
            for pod in pods:
                assert series(sample, pod=pod), (name, pod)
        if "model" in labels:
            assert series(sample, model=MODEL), name
    for pod in pods:
        for kind in UPSTREAM_ERROR_KINDS:
            assert series("kvgate_upstream_errors_total", pod=pod, kind=kind) == [0.0]
        assert series("kvgate_upstream_retries_total", pod=pod) == [0.0]
        assert series("kvgate_dead_pod_cuts_total", pod=pod) == [0.0]
        for status in ("200", "502", "504", "cut"):
            assert series("kvgate_requests_total", pod=pod, status=status, model=MODEL,
                          policy="prefix-cache") == [0.0]  # fmt: skip
        for cause in RESET_CAUSES:
            assert series("kvgate_subscriber_index_resets_total", pod=pod, cause=cause) == [0.0]
        for reason in DECODE_REASONS:
            assert series("kvgate_subscriber_rejected_frames_total", pod=pod, reason=reason)
    for reason in ("ModelNotFound", "TooManyRequests", "BadRequest", "NoRoutablePod"):
        assert series("kvgate_requests_rejected_total", reason=reason) == [0.0]
    for task in ("discovery", "metrics-scraper", "dead-pod-reaper"):
        assert series("kvgate_background_restarts_total", task=task) == [0.0]
    assert series("kvgate_slo_ttft_total", outcome="observed_missed") == [0.0]
    assert series("kvgate_pin_refusals_total", reason="budget") == [0.0]
