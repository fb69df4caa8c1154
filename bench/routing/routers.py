"""The routers under test, each started as its own process on a free loopback port.

- kvgate's policies: `kvgate serve --policy NAME`, a fresh gateway per run (no index or
  session state leaks from the previous router), ready when every subscriber is whole;
  NAME is a built-in policy or a profile of the run's `--routing-config`. Through the
  picker (`via="epp"`, `--mode epp`): `kvgate epp --policy NAME`, its ext_proc gRPC port
  the one after its HTTP port (`grpc_target`); the load generator plays Envoy.
- `oracle` and `sticky-rr` (oracle.py, sticky_rr.py): benchmark-only baselines.
- `sglang-router`, `vllm-router` (`--peers`): the PyPI packages in their own venvs under
  `bench/.venvs/NAME`, with `--policy cache_aware`. `HF_HUB_OFFLINE=1`: sglang-router
  tries to load the tokenizer the worker's `/model_info` names (`sim-model`), on no hub.
- `vllm-router-kv-aware`: vllm-router with `--policy kv_aware`, fed by every engine's KV
  events. It renders each request on the workers and keys its index by its own hashes of
  the events' token ids; its static sources take no topic and it reads only vLLM's
  default topic '', so a run including it starts vLLM-like engines
  (`FleetPlan.vllm_like`), which the other routers follow as well.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import subprocess
import sys
from collections.abc import Collection, Sequence
from pathlib import Path

import httpx

from bench.harness.fleet import EngineEndpoint
from bench.harness.gateway import AdminClient, serve_command
from bench.harness.ports import free_port_block
from bench.harness.processes import ChildProcess
from bench.harness.readiness import wait_http
from bench.harness.zmq_relay import EventRelay

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
VIAS = ("proxy", "epp")
"""How the load reaches kvgate's engines (`--mode`): through `kvgate serve` as a proxy, or
picked by `kvgate epp` over ext_proc and sent straight to the engine, as Envoy does."""


class RouterProcess(ChildProcess):
    """A router under test on `port`; `wait_ready()` once every router of a run started."""

    def __init__(
        self,
        name: str,
        command: list[str],
        log_path: Path,
        port: int,
        env: dict[str, str] | None = None,
        admin_token: str | None = None,
        relay: EventRelay | None = None,
        grpc_port: int | None = None,
    ) -> None:
        super().__init__(name, log_path)
        self.command = command
        self.port = port
        self.env = env or {}
        self.admin_token = admin_token
        self.relay = relay
        """The engines' KV events relayed for it (stopped with it)."""
        self.grpc_port = grpc_port
        """`kvgate epp`: its ext_proc port."""

    @property
    def grpc_target(self) -> str:
        """The picker's gRPC target (`kvgate epp`); empty for a proxy."""
        return "" if self.grpc_port is None else f"127.0.0.1:{self.grpc_port}"

    async def stop(self, grace_s: float = 5.0, sig: int | None = None) -> None:
        await super().stop(grace_s, sig)
        relay, self.relay = self.relay, None
        if relay is not None:
            await asyncio.to_thread(relay.stop)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        await self.spawn(self.command, env=self.env)

    async def wait_ready(self, client: httpx.AsyncClient, timeout_s: float = 60.0) -> None:
        await wait_http(f"{self.url}/health", self, timeout_s=timeout_s, interval_s=0.1)
        if self.name in PEERS:  # workers registered: the model is listed
            models = f"{self.url}/v1/models"
            await wait_http(models, self, timeout_s=timeout_s, accept=_lists_a_model)
        if self.admin_token is not None:  # kvgate: every subscriber live, whole, empty
            admin = AdminClient(client, self.url, self.admin_token)
            await admin.wait_whole(empty=True, timeout_s=timeout_s)


def _lists_a_model(response: httpx.Response) -> bool:
    return bool(response.json().get("data"))


def make_router(
    name: str,
    pods_file: Path,
    endpoints: Sequence[EngineEndpoint],
    log_dir: Path,
    rng: random.Random,
    block_hash: str = "sim",
    *,
    replica: int | None = None,
    prior_scale: float = 1.0,
    routing_config: Path | None = None,
    profiles: Collection[str] = KVGATE_POLICIES,
    engine_block_size: int = 16,
    tokenizers: str | None = None,
    via: str = "proxy",
) -> RouterProcess:
    """Router `name` on a free port; `replica`: one of several kvgate replicas (own log).
    kvgate's cost model is told that its pods answer `prior_scale` times as slowly as its
    prior says (a calibrated 14B model on one GPU), as an operator tells it of a slower
    GPU. `profiles`: the names that are kvgate's policies, the built-ins and those
    `routing_config` (given to every kvgate) declares. `engine_block_size`: tokens per
    block of the engines' KV events (for the peers that read them). `tokenizers`: kvgate's
    `KVGATE_TOKENIZERS` (its models' tokenizer files, to tokenize in-process). `via`: `epp`
    starts kvgate's policy as `kvgate epp` (one replica), its gRPC port `port + 1`."""
    port = free_port_block(2, rng)
    stem = f"router-{name}" if via == "proxy" else f"router-{name}-{via}"
    log = log_dir / (f"{stem}.log" if replica is None else f"{stem}-{replica}.log")
    if via != "proxy" and (name not in profiles or replica is not None):
        raise ValueError(f"{name!r} runs {via} as one kvgate replica only")
    if name in profiles:
        token = secrets.token_urlsafe(12)
        command = serve_command(pods_file, port, name)
        grpc_port = None
        if via == "epp":
            command[command.index("serve")] = "epp"
            grpc_port = port + 1
            command += ["--grpc-port", str(grpc_port)]
        env = {"KVGATE_ADMIN_TOKEN": token, "KVGATE_COST_PRIOR_SCALE": f"{prior_scale:g}"}
        if routing_config is not None:
            env["KVGATE_ROUTING_CONFIG"] = str(routing_config)
        if tokenizers is not None:
            env["KVGATE_TOKENIZERS"] = tokenizers
        return RouterProcess(name, command, log, port, env, token, grpc_port=grpc_port)
    if name in BASELINES:
        command = [sys.executable, "-m", BASELINES[name], str(pods_file), str(port), block_hash]
        return RouterProcess(name, command, log, port)
    if name in PEERS:
        workers = [endpoint.url for endpoint in endpoints]
        metrics = ["--prometheus-port", str(port + 1), "--prometheus-host", "127.0.0.1"]
        relay = None
        policy = ["cache_aware"]
        if name in VLLM_LIKE_PEERS:
            if any(e.events.startswith("ipc://") for e in endpoints):
                relay = EventRelay(endpoints)  # it takes tcp endpoints only
                endpoints = relay.start()
            policy = kv_aware_args(endpoints, engine_block_size)
        common = ["--worker-urls", *workers, "--policy", *policy,
                  "--host", "127.0.0.1", "--port", str(port), *metrics]  # fmt: skip
        venv = ensure_venv(PACKAGES[name])
        if name == "sglang-router":
            command = [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router",
                       *common, "--log-level", "warn"]  # fmt: skip
        else:
            command = [str(venv / "bin" / "vllm-router"), *common, "--log-level", "warning"]
        return RouterProcess(name, command, log, port, {"HF_HUB_OFFLINE": "1"}, relay=relay)
    raise ValueError(f"unknown router {name!r}")


def kv_aware_args(endpoints: Sequence[EngineEndpoint], block_size: int = 16) -> list[str]:
    """vllm-router's kv_aware policy fed by every engine's KV events (static sources; 0.1.17
    requires the model and block size for them)."""
    args = ["kv_aware", "--kv-event-block-size", str(block_size),
            "--kv-event-model", endpoints[0].model]  # fmt: skip
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
