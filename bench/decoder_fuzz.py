"""KV event decoder (`kvgate bench decoder`): fuzzing (only `DecodeError` may escape) and
decode throughput (docs/benchmarks.md).

Fuzz cases are mutations of the golden vLLM capture's payloads (`MUTATORS`: byte-level,
structural, random bytes, random multipart frames). A case *crashes* when anything but
`DecodeError` escapes, or when an accepted payload breaks an invariant (token count,
re-encoding round trip).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from bench.results_io import add_output_arguments, print_table, write_json
from subscriber import (
    BlockStored,
    DecodeError,
    decode_batch,
    decode_pub_message,
    decode_replay_message,
    encode_batch,
)

GOLDEN = (
    Path(__file__).resolve().parent.parent / "tests" / "golden" / "vllm-0.32.0-cpu-frames.jsonl"
)
MARKERS = (
    b"\xc0", b"\xc1", b"\xc2", b"\xc3", b"\xca\x7f\xc0\x00\x00", b"\xcb", b"\xcf\xff",
    b"\xd3\x80", b"\xdc\xff\xff", b"\xdd\x7f\xff\xff\xff", b"\xde\xff\xff", b"\xd9\xff",
    b"\xc4\x40", b"\xd4\x01\x00", b"\x90", b"\x80", b"\xa0", b"\x91\x93",
)  # fmt: skip
SPECIAL_VALUES: tuple[object, ...] = (
    None, True, False, 0, -1, 1, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), 2**64 - 1,
    0.0, -0.0, float("nan"), float("inf"), 1e308, "", "BlockStored", "BlockRemoved",
    "AllBlocksCleared", "GPU", "type", b"", b"\x00", b"\xff" * 16, b"\x01" * 64, b"\x02" * 65,
    [], {}, [None], ["BlockStored"], {"type": "BlockRemoved"}, {"type": 5},
)  # fmt: skip


@dataclass
class FuzzReport:
    cases: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    by_mutator: Counter[str] = field(default_factory=Counter)
    crashes: list[dict[str, str]] = field(default_factory=list)
    crash_count: int = 0
    seconds: float = 0.0


def load_golden_payloads(path: Path = GOLDEN) -> list[bytes]:
    """The payloads of the live PUB messages of a golden capture, in order."""
    payloads = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "live":
            payloads.append(bytes.fromhex(record["frames_hex"][2]))
    return payloads


def run_fuzz(cases: int, seed: int, payloads: Sequence[bytes]) -> FuzzReport:
    """Feed `cases` fuzz inputs to the decoder; never raises, records crashes instead."""
    rng = random.Random(seed)
    report = FuzzReport()
    start = time.perf_counter()
    for _ in range(cases):
        name, mutate = rng.choice(MUTATORS)
        report.by_mutator[name] += 1
        report.cases += 1
        data = mutate(rng, payloads)  # a fuzzer bug must not pass for a decoder crash
        try:
            if isinstance(data, list):
                _check_frames(data)
                continue
            batch = decode_batch(data)
            _check_accepted(batch)
            report.accepted += 1
        except DecodeError as exc:
            report.rejected[exc.reason] += 1
        except Exception as exc:  # the point of a fuzzer: record any other escape
            report.crash_count += 1
            if len(report.crashes) < 20:
                sample = data.hex()[:400] if isinstance(data, bytes) else repr(data)[:400]
                report.crashes.append({"mutator": name, "error": repr(exc), "input": sample})
    report.seconds = time.perf_counter() - start
    return report


def _check_accepted(batch: Any) -> None:
    for event in batch.events:
        if (
            isinstance(event, BlockStored)
            and len(event.token_ids) != len(event.block_hashes) * event.block_size
        ):
            raise AssertionError("accepted a BlockStored with a wrong token count")
    for encoding in ("map", "array"):
        # compared as bytes: an accepted NaN inside extra_keys is != itself
        payload = encode_batch(batch, encoding)
        if encode_batch(decode_batch(payload), encoding) != payload:
            raise AssertionError(f"{encoding} round trip changed the batch")


def _check_frames(frames: list[bytes]) -> None:
    for decode in (decode_pub_message, decode_replay_message):
        with contextlib.suppress(DecodeError):
            decode(frames)


# -- mutators: (rng, golden payloads) -> bytes, or a list of frames --------------------------


def _bit_flips(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    data = bytearray(rng.choice(payloads))
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def _byte_sets(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    data = bytearray(rng.choice(payloads))
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def _truncate(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    data = rng.choice(payloads)
    return data[: rng.randrange(len(data))]


def _extend(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    return rng.choice(payloads) + rng.randbytes(rng.randint(1, 16))


def _delete(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    data = rng.choice(payloads)
    at = rng.randrange(len(data))
    return data[:at] + data[at + rng.randint(1, 32) :]


def _splice(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    a, b = rng.choice(payloads), rng.choice(payloads)
    return a[: rng.randrange(len(a))] + b[rng.randrange(len(b)) :]


def _insert_marker(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    data = rng.choice(payloads)
    at = rng.randrange(len(data))
    return data[:at] + rng.choice(MARKERS) + data[at + rng.randint(0, 2) :]


def _random_bytes(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    head = rng.choice((b"", b"\x93", b"\x92", b"\x93\xcb", b"\x81"))
    return head + rng.randbytes(rng.randint(0, 64))


def _structural(rng: random.Random, payloads: Sequence[bytes]) -> bytes:
    tree = msgpack.unpackb(rng.choice(payloads), raw=False)
    for _ in range(rng.randint(1, 3)):
        slots = _slots(tree)
        if not slots:
            break
        container, key = rng.choice(slots)
        action = rng.random()
        if action < 0.6:
            container[key] = copy.deepcopy(rng.choice(SPECIAL_VALUES))  # never share them
        elif action < 0.8:
            del container[key]
        elif isinstance(container, list):
            container.insert(key, container[key])
        else:
            container[rng.choice(("extra", "locality", "block_size", "medium"))] = container[key]
    packed: bytes = msgpack.packb(tree, use_bin_type=True)
    return packed


def _slots(node: Any) -> list[tuple[Any, Any]]:
    slots: list[tuple[Any, Any]] = []
    stack = [node]
    while stack:
        current = stack.pop()
        keys = range(len(current)) if isinstance(current, list) else list(current)
        for key in keys:
            slots.append((current, key))
            if isinstance(current[key], list | dict):
                stack.append(current[key])
    return slots


def _frames(rng: random.Random, payloads: Sequence[bytes]) -> list[bytes]:
    pool = (b"", b"kv-events", b"\xff" * 8, (7).to_bytes(8, "big"), b"\x00" * 7, b"\xfe\xff")
    return [rng.choice((*pool, rng.choice(payloads))) for _ in range(rng.randint(0, 6))]


MUTATORS: tuple[tuple[str, Callable[[random.Random, Sequence[bytes]], Any]], ...] = (
    ("bit_flips", _bit_flips),
    ("byte_sets", _byte_sets),
    ("truncate", _truncate),
    ("extend", _extend),
    ("delete", _delete),
    ("splice", _splice),
    ("insert_marker", _insert_marker),
    ("random_bytes", _random_bytes),
    ("structural", _structural),
    ("structural", _structural),
    ("frames", _frames),
)


# -- throughput -------------------------------------------------------------------------------


def measure_throughput(payloads: Sequence[bytes], seconds: float = 1.0) -> dict[str, float]:
    """Decode rates on `payloads` (best of five runs of ~seconds/5 each)."""
    events = sum(len(decode_batch(p).events) for p in payloads)
    size = sum(len(p) for p in payloads)

    def best_rate(decode: Callable[[bytes], object]) -> float:
        rounds, best = 1, float("inf")
        while True:  # calibrate: one run of `rounds` passes takes >= seconds / 5
            start = time.perf_counter()
            for _ in range(rounds):
                for payload in payloads:
                    decode(payload)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / 5:
                break
            rounds *= 2
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(rounds):
                for payload in payloads:
                    decode(payload)
            best = min(best, time.perf_counter() - start)
        return rounds / best  # golden passes per second

    passes = best_rate(decode_batch)
    raw = best_rate(lambda p: msgpack.unpackb(p, raw=False, use_list=False))
    return {
        "decode_batches_per_s": passes * len(payloads),
        "decode_events_per_s": passes * events,
        "decode_mb_per_s": passes * size / 1e6,
        "unpackb_batches_per_s": raw * len(payloads),
        "golden_batches": len(payloads),
        "golden_events": events,
    }


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--cases", type=int, default=100_000, help="fuzz cases (default 100000)")
    add("--seed", type=int, default=1, help="fuzz seed (default 1)")
    add("--golden", type=Path, default=GOLDEN, metavar="PATH", help="golden capture (JSONL)")
    add("--seconds", type=float, default=2.0, help="time spent per throughput measurement")
    add_output_arguments(parser, "decoder_fuzz", plot=False)


def run(args: argparse.Namespace) -> int:
    payloads = load_golden_payloads(args.golden)
    print(f"fuzzing the decoder: {args.cases} cases, seed {args.seed}...")
    report = run_fuzz(args.cases, args.seed, payloads)
    rates = measure_throughput(payloads, args.seconds)
    results: dict[str, Any] = {
        "config": {"cases": args.cases, "seed": args.seed, "golden": str(args.golden)},
        "cases": report.cases,
        "crashes": report.crash_count,
        "accepted": report.accepted,
        "rejected_by_reason": dict(report.rejected.most_common()),
        "cases_by_mutator": dict(report.by_mutator.most_common()),
        "fuzz_cases_per_s": report.cases / report.seconds if report.seconds else 0.0,
        **rates,
        "crash_samples": report.crashes,
    }
    rows = [
        ("fuzz cases", f"{report.cases:,}", f"seed {args.seed}"),
        ("crashes", f"{report.crash_count}", "must be 0"),
        ("frame-level cases", f"{report.by_mutator['frames']:,}", "decode_*_message"),
        ("accepted (valid after mutation)", f"{report.accepted:,}", "re-encoded and re-checked"),
        *(
            (f"rejected: {reason}", f"{count:,}", "")
            for reason, count in report.rejected.most_common()
            if count
        ),
        ("fuzz cases/s", f"{results['fuzz_cases_per_s']:,.0f}", ""),
        ("decode batches/s", f"{rates['decode_batches_per_s']:,.0f}", "golden payloads"),
        ("decode events/s", f"{rates['decode_events_per_s']:,.0f}", "golden payloads"),
        ("decode MB/s", f"{rates['decode_mb_per_s']:,.1f}", ""),
        ("msgpack.unpackb batches/s", f"{rates['unpackb_batches_per_s']:,.0f}", "no checks"),
    ]
    print_table("KV event decoder: fuzzing and throughput", rows)
    for crash in report.crashes[:5]:
        print("crash:", crash)
    write_json(args.json, results)
    print(f"JSON written to {args.json}")
    return 1 if report.crash_count else 0
