"""`kvgate bench traces`: traces fetched over HTTP are kept only whole and as published,
and the ones present are described from their own content."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.routing.trace_files import FetchError, TraceFile, fetch

ROWS = [
    {"timestamp": 0, "input_length": 600, "output_length": 9, "hash_ids": [0, 1]},
    {"timestamp": 60_000, "input_length": 1100, "output_length": 30, "hash_ids": [0, 1, 2]},
]
CONTENT = "".join(json.dumps(row) + "\n" for row in ROWS).encode()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server on loopback serving `tmp_path / "www"`; yields its base URL."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "small_trace.jsonl").write_bytes(CONTENT)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


SMALL = TraceFile("small_trace", hashlib.sha256(CONTENT).hexdigest(), len(CONTENT))


def _fetch(trace: TraceFile, directory: Path, source: str) -> Path:
    async def one() -> Path:
        async with httpx.AsyncClient() as client:
            return await fetch(trace, directory, source, client)

    return asyncio.run(one())


def test_a_trace_is_kept_only_when_it_is_the_published_file(tmp_path: Path, served: str) -> None:
    target = tmp_path / "traces"
    target.mkdir()
    path = _fetch(SMALL, target, served)
    assert path == target / "small_trace.jsonl" and path.read_bytes() == CONTENT
    path.unlink()
    altered = TraceFile("small_trace", "0" * 64, len(CONTENT))
    with pytest.raises(FetchError, match="is not the published"):
        _fetch(altered, target, served)
    larger = TraceFile("small_trace", SMALL.sha256, len(CONTENT) - 1)
    with pytest.raises(FetchError, match="more than its"):
        _fetch(larger, target, served)
    absent = TraceFile("absent_trace", SMALL.sha256, len(CONTENT))
    with pytest.raises(FetchError, match="HTTP 404"):
        _fetch(absent, target, served)
    assert list(target.iterdir()) == []  # nothing partial left behind


def test_the_traces_present_are_described_from_their_content(tmp_path: Path) -> None:
    (tmp_path / "conversation_trace.jsonl").write_bytes(CONTENT)
    command = [sys.executable, "-m", "gateway.cli", "bench", "traces", "--dir", str(tmp_path)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "conversation_trace.jsonl | 2 | 1 min | 1,100 / 1,100 | 30 / 30 | 40%" in out.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    none = subprocess.run([*command[:-1], str(empty)], capture_output=True, text=True, timeout=60)
    assert "kvgate bench traces --fetch" in none.stdout
