"""The routers under test, each started as its own process on a free loopback port.

- `prefix-cache`, `least-request`, `round-robin`, `random`: `kvgate serve --policy NAME`
  (a fresh gateway per run, so no index or session state leaks from the previous router);
  ready when every KV-event subscriber is live and whole.
- `oracle`: `python -m bench.routing.oracle` (see oracle.py); `sticky-rr`:
  `python -m bench.routing.sticky_rr` (first turns round-robin, each conversation kept on
  its first engine: the simplest cache-friendly client).
- `sglang-router`, `vllm-router` (`--peers`): the PyPI packages in their own venvs under
  `bench/.venvs/NAME` (created on first use with pip), both with `--policy cache_aware`.
  `HF_HUB_OFFLINE=1`: sglang-router tries to load the tokenizer named by the worker's
  `/model_info` (`sim-model`), which is not on any hub; offline, it gives up at once.
- `vllm-router-kv-aware` (also `--peers`): vllm-router (same venv) with `--policy kv_aware`,
  fed by every engine's KV events (`--kv-event-source URL=tcp://…`, replay sources,
  `--kv-event-model`, `--kv-event-block-size 16`). It tokenizes nothing itself: it renders
  each request on the workers' `/v1/chat/completions/render` and keys its index by its own
  hashes of the events' `token_ids` (the engines' hashes only chain parents and name
  removals). Its static sources take no topic and it reads only vLLM's default topic '',
  so a run that includes it starts vLLM-like engines (`FleetPlan.vllm_like`: topic '',
  sha256_cbor hashes), which kvgate's routers and the oracle follow as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from bench.demo.fleet import EngineEndpoint, free_port_block
from bench.demo.gateway import AdminClient
from bench.processes import die_with_parent, log_tail, stop_group

KVGATE_POLICIES = (
    "prefix-cache", "least-request", "round-robin", "random", "prefix-share", "predicted-latency"
)  # fmt: skip
PEERS = ("sglang-router", "vllm-router", "vllm-router-kv-aware")
PACKAGES = {"sglang-router": "sglang-router", "vllm-router": "vllm-router",
            "vllm-router-kv-aware": "vllm-router"}  # fmt: skip
"""Each peer's PyPI package (its venv under bench/.venvs/)."""
VLLM_LIKE_PEERS = ("vllm-router-kv-aware",)
"""Peers that need engines publishing exactly as vLLM does (`FleetPlan.vllm_like`)."""
BASELINES = {"oracle": "bench.routing.oracle", "sticky-rr": "bench.routing.sticky_rr"}
"""Benchmark-only routers (their own processes): module to run, by router name."""
VENVS = Path(__file__).resolve().parent.parent / ".venvs"


class RouterError(RuntimeError):
    """A router did not start (its log tail is in the message)."""


@dataclass(slots=True)
class RouterProcess:
    name: str
    command: list[str]
    log_path: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    admin_token: str | None = None
    _process: asyncio.subprocess.Process | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._process = await asyncio.create_subprocess_exec(
            *self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, **self.env},
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )

    async def wait_ready(self, client: httpx.AsyncClient, timeout_s: float = 60.0) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                while not await self._ready(client):
                    if self._process is not None and self._process.returncode is not None:
                        raise RouterError(f"{self.name} exited: {self.log_tail()}")
                    await asyncio.sleep(0.1)
        except TimeoutError as exc:
            raise RouterError(f"{self.name} not ready in {timeout_s} s: {self.log_tail()}") from exc
        if self.admin_token is not None:  # kvgate: every subscriber live, whole, empty
            admin = AdminClient(client, self.url, self.admin_token)
            await admin.wait_whole(empty=True, timeout_s=timeout_s)

    async def _ready(self, client: httpx.AsyncClient) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(f"{self.url}/health", timeout=2.0)).status_code != 200:
                return False
            if self.name in PEERS:  # workers registered: the model is listed
                models = await client.get(f"{self.url}/v1/models", timeout=2.0)
                return models.status_code == 200 and bool(models.json().get("data"))
            return True
        return False

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    async def stop(self, grace_s: float = 5.0) -> None:
        process, self._process = self._process, None
        if process is not None:
            await stop_group(process, grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None


def make_router(
    name: str,
    pods_file: Path,
    endpoints: Sequence[EngineEndpoint],
    log_dir: Path,
    rng: random.Random,
    block_hash: str = "sim",
    *,
    replica: int | None = None,
) -> RouterProcess:
    """Router `name` on a free port; `replica`: one of several kvgate replicas (own log)."""
    port = free_port_block(2, rng)
    log = log_dir / (f"router-{name}.log" if replica is None else f"router-{name}-{replica}.log")
    if name in KVGATE_POLICIES:
        token = secrets.token_urlsafe(12)
        command = [
            sys.executable, "-m", "gateway.cli", "serve", "--pods", str(pods_file),
            "--port", str(port), "--policy", name, "--log-level", "warning",
        ]  # fmt: skip
        return RouterProcess(name, command, log, port, {"KVGATE_ADMIN_TOKEN": token}, token)
    if name in BASELINES:
        command = [sys.executable, "-m", BASELINES[name], str(pods_file), str(port), block_hash]
        return RouterProcess(name, command, log, port)
    if name in PEERS:
        workers = [endpoint.url for endpoint in endpoints]
        metrics = ["--prometheus-port", str(port + 1), "--prometheus-host", "127.0.0.1"]
        policy = kv_aware_args(endpoints) if name in VLLM_LIKE_PEERS else ["cache_aware"]
        common = ["--worker-urls", *workers, "--policy", *policy,
                  "--host", "127.0.0.1", "--port", str(port), *metrics]  # fmt: skip
        venv = ensure_venv(PACKAGES[name])
        if name == "sglang-router":
            command = [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router",
                       *common, "--log-level", "warn"]  # fmt: skip
        else:
            command = [str(venv / "bin" / "vllm-router"), *common, "--log-level", "warning"]
        return RouterProcess(name, command, log, port, {"HF_HUB_OFFLINE": "1"})
    raise ValueError(f"unknown router {name!r}")


def kv_aware_args(endpoints: Sequence[EngineEndpoint]) -> list[str]:
    """vllm-router's kv_aware policy fed by every engine's KV events (static sources; 0.1.17
    requires the model and block size for them)."""
    args = ["kv_aware", "--kv-event-block-size", "16", "--kv-event-model", endpoints[0].model]
    for endpoint in endpoints:
        args += ["--kv-event-source", f"{endpoint.url}={endpoint.events}"]
        if endpoint.replay:
            args += ["--kv-event-replay-source", f"{endpoint.url}={endpoint.replay}"]
    return args


def needs_vllm_like_engines(routers: Sequence[str]) -> bool:
    """Whether a router of the run needs engines that publish exactly as vLLM does."""
    return any(router in VLLM_LIKE_PEERS for router in routers)


def ensure_venv(package: str) -> Path:
    """`bench/.venvs/PACKAGE` with PACKAGE installed from PyPI (created on first use)."""
    venv = VENVS / package
    marker = venv / ".installed"
    if marker.exists():
        return venv
    print(f"installing {package} into {venv} (first use)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", package],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    marker.write_text(package + "\n")
    return venv
