"""Configuration of one simulated engine (a frozen dataclass built by the CLI or by tests)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from simulator.latency import LatencyModel
from simulator.publisher import EventsMode
from simulator.wire import EventEncoding, Flavor, HashFormat


@dataclass(frozen=True)
class SimConfig:
    name: str = "e1"
    host: str = "127.0.0.1"
    port: int = 8001
    model: str = "sim-model"
    tokenizer: Path | None = None
    """A Hugging Face tokenizer directory (`tokenizer.json`, `tokenizer_config.json`, a chat
    template) to serve with; None: the simulated model's (`simulator/tokenizer/`)."""
    loras: tuple[str, ...] = ()
    """LoRA adapters served besides the model (listed by /v1/models; generation and
    events treat them as the base model)."""
    block_size: int = 16
    gpu_blocks: int = 2048
    host_blocks: int = 0
    disk_dir: Path | None = None
    disk_blocks: int = 65_536
    disk_queue: int = 512
    events_endpoint: str = "tcp://127.0.0.1:5557"
    events_mode: EventsMode = "bind"
    replay_endpoint: str | None = "tcp://127.0.0.1:5558"
    replay_buffer: int = 10_000
    topic: str = "kv-events"
    event_encoding: EventEncoding = "map"
    hash_format: HashFormat = "int"
    flavor: Flavor = "vllm"
    max_batch: int = 32
    max_batched_tokens: int = 8192
    max_model_len: int = 16_384
    default_max_tokens: int = 16
    seed: int = 0
    hash_seed: int = 0
    block_hash: str = "sim"
    """How block hashes are computed: `sim` (the simulator's own) or `sha256_cbor` (vLLM's,
    with PYTHONHASHSEED = `hash_seed`)."""
    latency: LatencyModel = field(default_factory=LatencyModel)

    def __post_init__(self) -> None:
        checks = {
            "block_size": self.block_size >= 1,
            "gpu_blocks": self.gpu_blocks >= 1,
            "host_blocks": self.host_blocks >= 0,
            "disk_blocks": self.disk_blocks >= 1,
            "replay_buffer": self.replay_buffer >= 1,
            "max_batch": self.max_batch >= 1,
            "max_batched_tokens": self.max_batched_tokens >= 1,
            "max_model_len": self.max_model_len >= 2,
            "default_max_tokens": self.default_max_tokens >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid {name}: {getattr(self, name)!r}")
        if self.event_encoding not in ("map", "array"):
            raise ValueError(f"invalid event_encoding: {self.event_encoding!r}")
        if self.hash_format not in ("int", "bytes"):
            raise ValueError(f"invalid hash_format: {self.hash_format!r}")
        if self.block_hash not in ("sim", "sha256_cbor"):
            raise ValueError(f"invalid block_hash: {self.block_hash!r}")
        if self.flavor not in ("vllm", "sglang"):
            raise ValueError(f"invalid flavor: {self.flavor!r}")

    def for_fleet_member(self, index: int, base_port: int) -> SimConfig:
        """The config of engine `index` of a fleet: its own ports, name and disk directory.

        HTTP port `base_port + index`; ZMQ ports `+ 2 × index`, so the default adjacent
        events/replay ports (5557/5558) interleave without colliding.
        """
        return replace(
            self,
            name=f"{self.name}-{index}",
            port=base_port + index,
            events_endpoint=_offset_port(self.events_endpoint, 2 * index),
            replay_endpoint=(
                _offset_port(self.replay_endpoint, 2 * index) if self.replay_endpoint else None
            ),
            disk_dir=self.disk_dir / f"{self.name}-{index}" if self.disk_dir else None,
            seed=self.seed + index,
        )


def _offset_port(endpoint: str, offset: int) -> str:
    head, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or int(port) == 0:
        return endpoint
    return f"{head}:{int(port) + offset}"
