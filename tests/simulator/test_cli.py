"""`kvgate sim` flags, fleet configs, and a real fleet process started and stopped by signal."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from simulator.cli import config_from_args, configure_parser
from tests.helpers import free_ports


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return parser.parse_args(list(argv))


def test_flags_build_the_config() -> None:
    config = config_from_args(
        parse(
            "--name", "e7", "--port", "8007", "--block-size", "32", "--gpu-blocks", "64",
            "--host-blocks", "8", "--event-encoding", "array", "--hash-format", "bytes",
            "--flavor", "sglang", "--max-batch", "4", "--prefill-us-per-token", "50",
            "--decode-ms-per-token", "5", "--time-scale", "10", "--seed", "3",
            "--events-mode", "connect", "--replay-buffer", "99", "--topic", "",
        )
    )  # fmt: skip
    assert (config.name, config.port, config.block_size, config.gpu_blocks) == ("e7", 8007, 32, 64)
    assert (config.event_encoding, config.hash_format, config.flavor) == (
        "array",
        "bytes",
        "sglang",
    )
    assert config.latency.prefill_us_per_token == 50 and config.latency.time_scale == 10
    assert (config.events_mode, config.replay_buffer, config.topic) == ("connect", 99, "")


def test_the_tokenizer_flag_names_a_directory_that_must_hold_one(tmp_path: Path) -> None:
    assert config_from_args(parse()).tokenizer is None  # the shipped one
    assert config_from_args(parse("--tokenizer", str(tmp_path))).tokenizer == tmp_path
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "--tokenizer", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("kvgate sim: ") and "no tokenizer.json" in done.stderr


def test_fleet_members_get_their_own_ports_and_dirs() -> None:
    config = config_from_args(parse("--disk-dir", "/tmp/x", "--events", "tcp://127.0.0.1:5557"))
    member = config.for_fleet_member(2, 9000)
    assert (member.name, member.port) == ("e1-2", 9002)
    assert member.events_endpoint == "tcp://127.0.0.1:5561"  # ZMQ ports step by 2
    assert member.replay_endpoint == "tcp://127.0.0.1:5562"
    assert member.disk_dir == Path("/tmp/x/e1-2")


async def test_fleet_process_serves_and_stops_on_sigint() -> None:
    http = free_ports(2)[0]
    events = free_ports(4)[0]  # events and replay ports of 2 engines, interleaved
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simulator", "--fleet", "2", "--base-port", str(http),
        "--events", f"tcp://127.0.0.1:{events}", "--replay", f"tcp://127.0.0.1:{events + 1}",
        "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines = [(await asyncio.wait_for(proc.stdout.readline(), 20)).decode() for _ in range(2)]
        assert all(line.startswith("sim e1-") for line in lines)
        async with httpx.AsyncClient(timeout=5) as client:
            for port in (http, http + 1):
                assert (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
