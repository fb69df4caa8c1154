"""A running engine's latency profile, fitted to the simulator's `LatencyModel`.

The routing benchmark sizes its load from the fleet's ideal capacity, which it computes
with a `LatencyModel`; for real engines the model's figures are measured on them: the
time to first token of cold prompts of a few lengths (random words, so nothing is cached)
fitted to overhead + a·P + q·P², and the time per decode step at batch 1 and at a small
batch, fitted to decode_ms_per_token + decode_ms_per_seq × batch. Requests go straight to
the engine (`/v1/completions`, streamed: vLLM sends one chunk per generated token there).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from bench.harness.engine_stats import reset_prefix_caches
from bench.harness.fleet import EngineEndpoint
from simulator.latency import LatencyModel

PREFILL_LENGTHS = (128, 256, 512, 1024, 1536, 2048)


@dataclass(frozen=True, slots=True)
class Timed:
    """One streamed completion: prompt tokens, generated tokens, seconds to the first
    token and from the first to the last."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    decode_s: float

    @property
    def step_s(self) -> float:
        """Seconds per decode step after the first token."""
        return self.decode_s / (self.completion_tokens - 1) if self.completion_tokens > 1 else 0


@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """What was measured: cold TTFT by prompt length, decode step time by batch size."""

    prefill_s: dict[int, float]
    """Prompt tokens (as the engine counted them) → seconds to the first token (the
    fastest of the repeats: whatever else runs on the machine only ever adds time)."""
    decode_step_ms: dict[int, float]
    """Concurrent requests → median milliseconds per decode step."""

    def model(self) -> LatencyModel:
        """The simulator's figures that reproduce these (host and disk loads left at their
        defaults): the best non-negative least-squares fit, on relative errors."""
        overhead_s, linear, square = fit_prefill(self.prefill_s)
        per_token, per_seq = fit_decode(self.decode_step_ms)
        return LatencyModel(
            request_overhead_ms=overhead_s * 1e3,
            prefill_us_per_token=linear * 1e6,
            prefill_us_per_token_sq=square * 1e6,
            decode_ms_per_token=per_token,
            decode_ms_per_seq=per_seq,
        )


def fit_prefill(points: dict[int, float]) -> tuple[float, float, float]:
    """(overhead s, s per token, s per token²) minimising the relative errors of
    overhead + a·P + q·P² over `points`, all three >= 0: the best of the fits on each
    subset of the terms whose coefficients all come out non-negative."""
    lengths = sorted(points)
    rows = [(1.0, p / 1e3, (p / 1e3) ** 2) for p in lengths]  # in thousands: well scaled
    times = [points[p] for p in lengths]
    best: tuple[float, list[float]] | None = None
    for size in (3, 2, 1):
        for terms in itertools.combinations(range(3), min(size, len(lengths))):
            # Each row divided by its time: least squares on relative errors.
            scaled = [[row[k] / t for k in terms] for row, t in zip(rows, times, strict=True)]
            solved = _least_squares(scaled, [1.0] * len(times))
            if solved is None or min(solved) < 0:
                continue
            coefficients = [0.0, 0.0, 0.0]
            for term, value in zip(terms, solved, strict=True):
                coefficients[term] = value
            error = sum((_dot(coefficients, row) / t - 1) ** 2
                        for row, t in zip(rows, times, strict=True))  # fmt: skip
            if best is None or error < best[0]:
                best = (error, coefficients)
    if best is None:
        raise ValueError(f"cannot fit prefill times {points}")
    overhead, linear, square = best[1]
    return overhead, linear / 1e3, square / 1e6


def _dot(left: Sequence[float], right: Sequence[float]) -> float:
    return sum(a * b for a, b in zip(left, right, strict=True))


def fit_decode(steps_ms: dict[int, float]) -> tuple[float, float]:
    """(ms per step, ms per sequence in the batch) through the smallest and the largest
    batch measured, the second clamped at 0."""
    low, high = min(steps_ms), max(steps_ms)
    per_seq = max(0.0, (steps_ms[high] - steps_ms[low]) / (high - low)) if high > low else 0.0
    return max(0.0, steps_ms[low] - per_seq * low), per_seq


def _least_squares(rows: list[list[float]], values: list[float]) -> list[float] | None:
    """Solve the normal equations (systems of at most 3 unknowns) by Gauss-Jordan
    elimination; None when singular."""
    n = len(rows[0])
    columns = list(zip(*rows, strict=True))
    matrix = [[_dot(columns[i], columns[j]) for j in range(n)] + [_dot(columns[i], values)]
              for i in range(n)]  # fmt: skip
    for col in range(n):
        pivot = max(range(col, n), key=lambda row: abs(matrix[row][col]))
        if abs(matrix[pivot][col]) < 1e-12 * max(1.0, abs(matrix[col][col])):
            return None
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        for row in range(n):
            if row != col:
                factor = matrix[row][col] / matrix[col][col]
                matrix[row] = [a - factor * b for a, b in zip(matrix[row], matrix[col],
                                                              strict=True)]  # fmt: skip
    return [matrix[i][n] / matrix[i][i] for i in range(n)]


def cold_prompt(words: Sequence[str], tokens: int, rng: random.Random) -> str:
    """Random single-token words making `tokens` prompt tokens with the BOS the engine adds
    (random, so no block of it is cached anywhere)."""
    return "".join(f" {rng.choice(words)}" for _ in range(tokens - 1))


async def timed_completion(
    client: httpx.AsyncClient, endpoint: EngineEndpoint, prompt: str, max_tokens: int
) -> Timed:
    """One streamed completion of exactly `max_tokens` tokens, timed."""
    body = {"model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    started = time.perf_counter()
    first = last = 0.0
    usage: dict[str, int] = {}
    async with client.stream("POST", f"{endpoint.url}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                last = time.perf_counter()
                first = first or last
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
    if not first or not usage:
        raise RuntimeError(f"{endpoint.name}: the stream carried no token or no usage")
    return Timed(usage["prompt_tokens"], usage["completion_tokens"], first - started,
                 last - first)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    lengths: tuple[int, ...] = PREFILL_LENGTHS
    """Cold prompt lengths in tokens (those beyond the engine's context are skipped)."""
    repeats: int = 3
    """Requests per length (the fastest counts)."""
    decode_tokens: int = 48
    decode_batch: int = 4
    """The second batch size decode steps are timed at (the first is 1)."""
    seed: int = 0


async def profile_engine(
    client: httpx.AsyncClient,
    endpoint: EngineEndpoint,
    words: Sequence[str],
    settings: ProfileSettings = ProfileSettings(),
    *,
    max_model_len: int | None = None,
) -> LatencyProfile:
    """Measure `endpoint` (idle, nothing else running on it): each cold prompt length
    `repeats` times, one request at a time, then decode steps at batch 1 and at
    `decode_batch`. `words`: single-token words (`vllm_fleet.single_token_words`). The
    prefix cache is reset before and after."""
    rng = random.Random(settings.seed)
    limit = max_model_len or max(settings.lengths) + 1
    await reset_prefix_caches(client, [endpoint.url])
    await timed_completion(client, endpoint, cold_prompt(words, 32, rng), 4)  # warm-up
    prefill: dict[int, list[float]] = {}
    # (a prompt and its answer within the context, with room for a BOS token)
    for length in (n for n in settings.lengths if n + 8 <= limit):
        for _ in range(settings.repeats):
            timed = await timed_completion(client, endpoint, cold_prompt(words, length, rng), 1)
            prefill.setdefault(timed.prompt_tokens, []).append(timed.ttft_s)
    steps: dict[int, float] = {}
    for batch in sorted({1, settings.decode_batch}):
        runs = await asyncio.gather(*(
            timed_completion(client, endpoint, cold_prompt(words, 64, rng),
                             settings.decode_tokens)
            for _ in range(batch)
        ))  # fmt: skip
        steps[batch] = statistics.median(run.step_s for run in runs) * 1e3
    await reset_prefix_caches(client, [endpoint.url])
    return LatencyProfile({p: min(t) for p, t in prefill.items()}, steps)


async def measure_latency(
    client: httpx.AsyncClient,
    endpoint: EngineEndpoint,
    words: Sequence[str],
    settings: ProfileSettings = ProfileSettings(),
    *,
    max_model_len: int | None = None,
) -> LatencyModel:
    """The engine's `LatencyModel`: `profile_engine(...)`, fitted."""
    profile = await profile_engine(client, endpoint, words, settings, max_model_len=max_model_len)
    return profile.model()
