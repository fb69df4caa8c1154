"""The processes a chaos or soak run drives: one `python -m simulator` per engine and one
`kvgate serve`, each on fixed loopback ports so a killed process comes back on the same
address (as a restarted pod keeps its Service address).

Every child runs in its own session (a Ctrl-C reaches the harness only, which then stops
things in order) and, on Linux, gets SIGTERM if the harness dies (`PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from bench.processes import die_with_parent, log_tail

MODEL = "sim-model"
_START_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class EngineAddress:
    name: str
    port: int
    events_port: int
    replay_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def pod_entry(self) -> dict[str, str]:
        return {"name": self.name, "url": self.url, "model": MODEL, "events": self.events,
                "replay": self.replay, "topic": "kv-events"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class EngineOptions:
    gpu_blocks: int = 512
    replay_buffer: int = 10_000
    time_scale: float = 10.0
    max_batch: int = 64


def proc_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def proc_open_fds(pid: int) -> int | None:
    try:
        return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None


class _Child:
    """One child process; `kill()` is a crash (SIGKILL), `stop()` a clean shutdown."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    async def _spawn(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdout=self._log,
            stderr=self._log,
            stdin=asyncio.subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        self.starts += 1

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    async def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self._close_log()

    async def stop(self, grace_s: float = 5.0, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self._close_log()

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)


async def _wait_http(url: str, child: _Child, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if child.proc is None or child.proc.returncode is not None:
                raise RuntimeError(f"{child.name} exited on start-up:\n{child.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{child.name} not ready after {timeout_s} s:\n{child.log_tail()}")


class EngineProcess(_Child):
    """One simulated vLLM engine; every (re)start binds the same HTTP and ZMQ ports."""

    def __init__(
        self, address: EngineAddress, options: EngineOptions, log_path: Path, seed: int
    ) -> None:
        super().__init__(address.name, log_path)
        self.address = address
        self.options = options
        self.seed = seed

    def command(self) -> list[str]:
        a, o = self.address, self.options
        return [
            sys.executable,
            "-m",
            "simulator",
            "--name",
            a.name,
            "--port",
            str(a.port),
            "--events",
            a.events,
            "--replay",
            a.replay,
            "--replay-buffer",
            str(o.replay_buffer),
            "--gpu-blocks",
            str(o.gpu_blocks),
            "--time-scale",
            str(o.time_scale),
            "--max-batch",
            str(o.max_batch),
            "--max-model-len",
            "32768",
            "--seed",
            str(self.seed + self.starts),
            "--log-level",
            "warning",
        ]

    async def start(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        await self._spawn(self.command())
        await _wait_http(f"{self.address.url}/health", self, timeout_s)


class GatewayProcess(_Child):
    """`kvgate serve` with a pods file, an admin token and (optionally) a snapshot dir."""

    def __init__(
        self,
        port: int,
        pods_file: Path,
        log_path: Path,
        *,
        admin_token: str,
        snapshot_dir: Path | None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        super().__init__("gateway", log_path)
        self.port = port
        self.pods_file = pods_file
        self.admin_token = admin_token
        self.snapshot_dir = snapshot_dir
        self.extra_env = extra_env or {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KVGATE_ADMIN_TOKEN"] = self.admin_token
        env.setdefault("KVGATE_UPSTREAM_TIMEOUT", "60")
        if self.snapshot_dir is not None:
            # Honoured by gateways with index persistence; others ignore it.
            env["KVGATE_SNAPSHOT_DIR"] = str(self.snapshot_dir)
            env.setdefault("KVGATE_SNAPSHOT_INTERVAL_S", "1")
        env.update(self.extra_env)
        return env

    async def start(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--pods", str(self.pods_file),
               "--port", str(self.port), "--log-level", "warning"]  # fmt: skip
        await self._spawn(cmd, env=self.environment())
        await _wait_http(f"{self.url}/ready", self, timeout_s)


def write_pods_file(path: Path, engines: list[EngineAddress]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pods": [e.pod_entry() for e in engines]}, indent=2) + "\n")
    return path


def engine_addresses(base_port: int, count: int) -> list[EngineAddress]:
    """Engine i: HTTP base+3i, events base+3i+1, replay base+3i+2."""
    return [
        EngineAddress(f"chaos-{i}", base_port + 3 * i, base_port + 3 * i + 1, base_port + 3 * i + 2)
        for i in range(count)
    ]
