"""`kvgate sim`: one simulated vLLM/SGLang engine, or a fleet of them with `--fleet N`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from simulator.config import SimConfig
from simulator.engine import SimEngine
from simulator.latency import LatencyModel
from simulator.server import serve_fleet
from simulator.tokenizer import SimTokenizer
from tokenization import TokenizationError

_DEFAULTS = SimConfig()
_LATENCY = LatencyModel()


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--name", default=_DEFAULTS.name, help="engine name (fleet members get -0, -1, …)")
    add("--host", default=_DEFAULTS.host, help="HTTP bind address")
    add("--port", type=int, default=_DEFAULTS.port, help="HTTP port (0 = any free port)")
    add("--model", default=_DEFAULTS.model, help="served model name")
    add(
        "--tokenizer",
        type=Path,
        default=None,
        metavar="DIR",
        help="a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json, chat "
        "template) to tokenize and render chats with (default: the simulated model's)",
    )
    add("--lora", action="append", default=[], help="a LoRA adapter name to list (repeatable)")
    add("--block-size", type=int, default=_DEFAULTS.block_size, help="tokens per KV block")
    add("--gpu-blocks", type=int, default=_DEFAULTS.gpu_blocks, help="GPU KV cache blocks")
    add("--host-blocks", type=int, default=0, help="host (CPU) tier blocks; 0 disables")
    add("--disk-dir", type=Path, default=None, help="persistent STORAGE tier directory")
    add("--disk-blocks", type=int, default=_DEFAULTS.disk_blocks, help="STORAGE tier blocks")
    add("--events", default=_DEFAULTS.events_endpoint, help="KV events PUB endpoint")
    add(
        "--events-mode",
        choices=["bind", "connect", "auto"],
        default=_DEFAULTS.events_mode,
        help="bind or connect the PUB socket (auto = vLLM's rule: bind if '*' or ipc://)",
    )
    add("--replay", default=_DEFAULTS.replay_endpoint, help="replay ROUTER endpoint ('' = none)")
    add("--replay-buffer", type=int, default=_DEFAULTS.replay_buffer, help="batches kept")
    add("--topic", default=_DEFAULTS.topic, help="PUB topic")
    add("--event-encoding", choices=["map", "array"], default=_DEFAULTS.event_encoding)
    add("--hash-format", choices=["int", "bytes"], default=_DEFAULTS.hash_format)
    add(
        "--block-hash",
        choices=["sim", "sha256_cbor"],
        default=_DEFAULTS.block_hash,
        help="block hash scheme: the simulator's own, or vLLM's sha256_cbor (first parent "
        "from PYTHONHASHSEED = --hash-seed), which routers recomputing vLLM's hashes follow",
    )
    add("--flavor", choices=["vllm", "sglang"], default=_DEFAULTS.flavor)
    add("--max-batch", type=int, default=_DEFAULTS.max_batch, help="max running requests")
    add(
        "--max-batched-tokens",
        type=int,
        default=_DEFAULTS.max_batched_tokens,
        help="prefill token budget per engine step",
    )
    add("--max-model-len", type=int, default=_DEFAULTS.max_model_len)
    add("--default-max-tokens", type=int, default=_DEFAULTS.default_max_tokens)
    add("--prefill-us-per-token", type=float, default=_LATENCY.prefill_us_per_token)
    add(
        "--prefill-us-per-token-sq",
        type=float,
        default=_LATENCY.prefill_us_per_token_sq,
        help="attention term: µs per token² of context",
    )
    add("--request-overhead-ms", type=float, default=_LATENCY.request_overhead_ms)
    add("--host-load-us-per-token", type=float, default=_LATENCY.host_load_us_per_token)
    add("--disk-load-us-per-token", type=float, default=_LATENCY.disk_load_us_per_token)
    add("--decode-ms-per-token", type=float, default=_LATENCY.decode_ms_per_token)
    add("--decode-ms-per-seq", type=float, default=_LATENCY.decode_ms_per_seq)
    add("--time-scale", type=float, default=1.0, help="divide every simulated duration by this")
    add("--seed", type=int, default=0, help="seed of generated tokens and fault randomness")
    add("--hash-seed", type=int, default=0, help="block hash seed (keep stable for disk tier)")
    add("--fleet", type=int, default=0, help="start N engines in this process")
    add("--base-port", type=int, default=None, help="fleet: HTTP port of engine 0 (then +1…)")
    add("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace) -> SimConfig:
    latency = LatencyModel(
        request_overhead_ms=args.request_overhead_ms,
        prefill_us_per_token=args.prefill_us_per_token,
        prefill_us_per_token_sq=args.prefill_us_per_token_sq,
        host_load_us_per_token=args.host_load_us_per_token,
        disk_load_us_per_token=args.disk_load_us_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        decode_ms_per_seq=args.decode_ms_per_seq,
        time_scale=args.time_scale,
    )
    return SimConfig(
        name=args.name,
        host=args.host,
        port=args.port,
        model=args.model,
        tokenizer=args.tokenizer,
        loras=tuple(args.lora),
        block_size=args.block_size,
        gpu_blocks=args.gpu_blocks,
        host_blocks=args.host_blocks,
        disk_dir=args.disk_dir,
        disk_blocks=args.disk_blocks,
        events_endpoint=args.events,
        events_mode=args.events_mode,
        replay_endpoint=args.replay or None,
        replay_buffer=args.replay_buffer,
        topic=args.topic,
        event_encoding=args.event_encoding,
        hash_format=args.hash_format,
        flavor=args.flavor,
        max_batch=args.max_batch,
        max_batched_tokens=args.max_batched_tokens,
        max_model_len=args.max_model_len,
        default_max_tokens=args.default_max_tokens,
        seed=args.seed,
        hash_seed=args.hash_seed,
        block_hash=args.block_hash,
        latency=latency,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        config = config_from_args(args)
        SimTokenizer.load(config.tokenizer)  # unusable files stop here, not in each engine
    except (ValueError, TokenizationError) as exc:
        print(f"kvgate sim: {exc}", file=sys.stderr)
        return 2
    if args.fleet < 0:
        print(f"kvgate sim: --fleet must be >= 0, got {args.fleet}", file=sys.stderr)
        return 2
    if args.fleet:
        base = args.base_port if args.base_port is not None else config.port
        configs = [config.for_fleet_member(i, base) for i in range(args.fleet)]
    else:
        configs = [config]

    async def main() -> None:
        await serve_fleet([SimEngine(c) for c in configs], log_level=args.log_level)

    asyncio.run(main())
    return 0
