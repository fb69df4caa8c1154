"""`kvgate bench traces`: the public production traces `bench routing --trace` replays —
fetched from their source, checked against their published content, and described.

Mooncake's FAST'25 traces (kvcache-ai/Mooncake, `FAST25-release/traces/`, Apache-2.0),
pinned to the commit they were measured at: each file is downloaded whole and kept only if
its SHA-256 is the one below, so every figure the docs give is of exactly these requests.
(The release's third file, `toolagent_trace.jsonl`, could not be obtained where these
figures were made, so no checksum is pinned for it: give its path to `--trace` as is.)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.routing.trace import TraceError, TraceSpec, describe, load_trace

TRACES_DIR = Path(__file__).resolve().parent.parent / "traces"
SOURCE = (
    "https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
    "3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/FAST25-release/traces"
)


@dataclass(frozen=True, slots=True)
class TraceFile:
    name: str
    sha256: str
    size: int

    @property
    def file_name(self) -> str:
        return f"{self.name}.jsonl"


TRACES = (
    TraceFile(
        "conversation_trace",
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        3_029_533,
    ),
    TraceFile(
        "synthetic_trace",
        "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
        1_136_313,
    ),
)


class FetchError(Exception):
    """A trace that could not be fetched whole and as published."""


async def fetch(trace: TraceFile, directory: Path, source: str, client: httpx.AsyncClient) -> Path:
    """`trace` from `source` into `directory`, kept only when its checksum matches."""
    target = directory / trace.file_name
    partial = target.with_suffix(".part")
    digest = hashlib.sha256()
    try:
        async with client.stream("GET", f"{source.rstrip('/')}/{trace.file_name}") as answer:
            if answer.status_code != 200:
                raise FetchError(f"{trace.name}: HTTP {answer.status_code} from {answer.url}")
            with partial.open("wb") as out:
                async for chunk in answer.aiter_bytes():
                    digest.update(chunk)
                    out.write(chunk)
                    if out.tell() > trace.size:
                        raise FetchError(f"{trace.name}: more than its {trace.size:,} bytes")
        if digest.hexdigest() != trace.sha256:
            raise FetchError(f"{trace.name}: SHA-256 {digest.hexdigest()} is not the "
                             f"published {trace.sha256}")  # fmt: skip
        partial.replace(target)
    except httpx.HTTPError as error:
        raise FetchError(f"{trace.name}: {type(error).__name__}: {error}") from None
    finally:
        partial.unlink(missing_ok=True)
    return target


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--fetch", action="store_true", help="download the traces missing from --dir")
    add("--dir", type=Path, default=TRACES_DIR, help="where the traces are (bench/traces)")
    add("--source", default=SOURCE, help="where they are fetched from (Mooncake, pinned)")


def run(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    if args.fetch:
        directory.mkdir(parents=True, exist_ok=True)
        missing = [t for t in TRACES if not (directory / t.file_name).exists()]
        try:
            asyncio.run(_fetch_all(missing, directory, args.source))
        except FetchError as error:
            print(f"kvgate bench traces: {error}", file=sys.stderr)
            return 1
    present = [t for t in TRACES if (directory / t.file_name).exists()]
    if not present:
        print(f"no trace in {directory}: `kvgate bench traces --fetch` downloads them")
        return 0
    print("trace | requests | span | input tokens p50 / p90 | output p50 / p90 | "
          "blocks reused (unbounded cache)")  # fmt: skip
    for trace in present:
        try:
            figures = describe(load_trace(TraceSpec(str(directory / trace.file_name))))
        except TraceError as error:
            print(f"kvgate bench traces: {error}", file=sys.stderr)
            return 1
        print(f"{trace.file_name} | {figures['requests']:,.0f} | {figures['span_s'] / 60:.0f} min"
              f" | {figures['input_p50']:,.0f} / {figures['input_p90']:,.0f}"
              f" | {figures['output_p50']:,.0f} / {figures['output_p90']:,.0f}"
              f" | {figures['reused_block_share']:.0%}")  # fmt: skip
    return 0


async def _fetch_all(traces: list[TraceFile], directory: Path, source: str) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=10.0)) as client:
        for trace in traces:
            path = await fetch(trace, directory, source, client)
            print(f"fetched {path}")
