"""Helpers shared by the subscriber tests: the golden vLLM 0.32.0 capture."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.golden import FRAMES as GOLDEN


@dataclass(frozen=True, slots=True)
class GoldenRecord:
    kind: str  # "live" (a PUB message) or "replay" (one replay reply)
    frames: list[bytes]
    start: int | None = None  # the replay request's start seq


def load_golden() -> list[GoldenRecord]:
    records = []
    for line in GOLDEN.read_text().splitlines():
        raw = json.loads(line)
        frames = [bytes.fromhex(h) for h in raw["frames_hex"]]
        records.append(GoldenRecord(raw["kind"], frames, raw.get("start")))
    return records


@pytest.fixture(scope="session")
def golden() -> list[GoldenRecord]:
    return load_golden()


@pytest.fixture(scope="session")
def live_payloads(golden: list[GoldenRecord]) -> list[bytes]:
    return [r.frames[2] for r in golden if r.kind == "live"]
