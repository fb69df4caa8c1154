"""Production traces as routing workloads: Mooncake's request traces, replayed with their
prefix structure exact (`kvgate bench routing --trace PATH`).

A trace is JSONL, one request a line: `{"timestamp": ms, "input_length": n,
"output_length": m, "hash_ids": [...]}`, each hash id one block of 512 prompt tokens
(`TRACE_BLOCK_TOKENS`); two requests sharing their first k hash ids share exactly their
first k × 512 prompt tokens (kvcache-ai/Mooncake, `FAST25-release/`).

The prompts are synthesized: a hash id becomes 512 words drawn from a vocabulary whose
every word is one token (with its leading space) for the engines' tokenizer, seeded by the
id; a prompt is its blocks' words in order, the last block cut to `input_length`. So equal
ids give identical token blocks, different ids different ones, and a prompt is exactly
`input_length` tokens of content — sent as the one user message of a streamed chat
completion, the request every router here speaks (the chat template adds the same few
tokens around every prompt, which shifts no shared prefix). Text rather than token ids,
because every router under test must see what a client sends: kvgate and the peers
tokenize it themselves.

Each request is its own one-turn conversation (`Script.arrivals` holds its time). Its
session — sent as `x-session-id`, for the session-sticky baseline — continues the latest
earlier request whose whole prompt (its full blocks, two at least: one more than a shared
system prompt) begins this one, as a chat's next turn does; otherwise it opens one. Its
traffic class (`tag`) is its prompt's size: `short` under 4 k tokens, `long` from 32 k,
`mid` between, so the report's per-class TTFT shows who waits for whom.
"""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from bench.results_io import percentile
from bench.routing.script import Conversation, Message, Script, ScriptTurn

TRACE_BLOCK_TOKENS = 512
"""Prompt tokens one hash id stands for (Mooncake's block size)."""
SIZE_CLASSES = (("short", 4096), ("mid", 32768), ("long", math.inf))
"""A request's traffic class: the first whose bound its prompt is under."""
MIN_SESSION_BLOCKS = 2
"""A request continues a session only if it begins with an earlier prompt of at least this
many full blocks: every request of a trace may share one system-prompt block."""


class TraceError(ValueError):
    """A trace file that cannot be replayed (with the line that says why)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    at_s: float
    """Seconds after the start of the trace (or of its window)."""
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    block_tokens: int = TRACE_BLOCK_TOKENS
    """Prompt tokens per hash id (fewer in a trace scaled down: `TraceSpec.scale`)."""


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """Which requests of which trace file: all that a load generator needs to rebuild the
    same script."""

    path: str
    window: tuple[float, float] | None = None
    """[start, end) in seconds of trace time; None: the whole trace."""
    max_output: int | None = None
    """Answers capped at this many tokens; None: as the trace has them."""
    scale: float = 1.0
    """Every length times this (blocks of 512 × scale tokens, each prompt's part of its
    last block and each answer alike): the trace's structure for engines that serve
    prompts of a fraction of its lengths (real engines on CPU)."""

    @property
    def block_tokens(self) -> int:
        """Prompt tokens one hash id stands for, scaled."""
        return max(1, round(TRACE_BLOCK_TOKENS * self.scale))

    @property
    def name(self) -> str:
        """The workload's name: `trace:` and the file's stem (`trace:conversation_trace`)."""
        stem = Path(self.path).name
        for suffix in (".gz", ".jsonl", ".json"):
            stem = stem.removesuffix(suffix)
        return f"trace:{stem}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "window": self.window, "max_output": self.max_output,
                "scale": self.scale}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TraceSpec:
        window = data.get("window")
        return cls(data["path"], None if window is None else (window[0], window[1]),
                   data.get("max_output"), float(data.get("scale", 1.0)))  # fmt: skip


def read_trace(path: Path) -> list[TraceRequest]:
    """Every request of a Mooncake trace file, in time order."""
    requests: list[TraceRequest] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                requests.append(_request(line, f"{path}:{number}"))
    if not requests:
        raise TraceError(f"{path}: no requests")
    requests.sort(key=lambda r: r.at_s)  # stable: requests of one instant keep their order
    return requests


def _request(line: str, where: str) -> TraceRequest:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not JSON ({error.msg})") from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}: not a JSON object")
    at = row.get("timestamp")
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < math.inf:
        raise TraceError(f"{where}: timestamp must be a number of ms >= 0, got {at!r}")
    length = _integer(row, "input_length", 1, where)
    output = _integer(row, "output_length", 0, where)
    ids = row.get("hash_ids")
    if not isinstance(ids, list) or not all(_is_int(h) for h in ids):
        raise TraceError(f"{where}: hash_ids must be a list of integers")
    if len(ids) != -(-length // TRACE_BLOCK_TOKENS):
        raise TraceError(f"{where}: {len(ids)} hash_ids for {length} input tokens "
                         f"(one per {TRACE_BLOCK_TOKENS})")  # fmt: skip
    return TraceRequest(at / 1e3, length, max(1, output), tuple(ids))


def _integer(row: dict[str, Any], key: str, least: int, where: str) -> int:
    value = row.get(key)
    if not _is_int(value) or value < least:
        raise TraceError(f"{where}: {key} must be an integer >= {least}, got {value!r}")
    return value


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def load_trace(spec: TraceSpec) -> list[TraceRequest]:
    """The requests `spec` selects, their times counted from the window's start, their
    lengths scaled and their answers capped."""
    requests = read_trace(Path(spec.path))
    start = 0.0
    if spec.window is not None:
        start, end = spec.window
        requests = [r for r in requests if start <= r.at_s < end]
        if not requests:
            raise TraceError(f"{spec.path}: no request in the window {start:g}:{end:g} s")
    block = spec.block_tokens
    cap = spec.max_output
    scaled = []
    for r in requests:
        full = len(r.hash_ids) - 1  # the last block's part, scaled like the blocks
        last = r.input_length - full * TRACE_BLOCK_TOKENS
        length = full * block + max(1, round(last * block / TRACE_BLOCK_TOKENS))
        output = max(1, round(r.output_length * spec.scale))
        output = output if cap is None else min(cap, output)
        scaled.append(TraceRequest(r.at_s - start, length, output, r.hash_ids, block))
    return scaled


def reused_blocks(
    requests: Sequence[TraceRequest], capacity_blocks: int | None = None
) -> list[int]:
    """Per request, how many of its leading blocks an earlier request already computed:
    what a cache could give it. `capacity_blocks`: one least-recently-used cache of that
    many trace blocks (the whole fleet's, as if routed perfectly); None: unbounded."""
    seen: OrderedDict[int, None] = OrderedDict()
    reused = []
    for request in requests:
        count = 0
        for block in request.hash_ids:
            if block not in seen:
                break
            count += 1
        reused.append(count)
        for block in request.hash_ids:
            if block in seen:
                seen.move_to_end(block)
            else:
                seen[block] = None
                if capacity_blocks is not None and len(seen) > capacity_blocks:
                    seen.popitem(last=False)
    return reused


def cached_tokens(request: TraceRequest, blocks: int, block_size: int) -> int:
    """Prompt tokens of `request` an engine of `block_size` serves from cache when `blocks`
    of its leading trace blocks are there (whole engine blocks; the last token is always
    computed)."""
    tokens = min(blocks * request.block_tokens, request.input_length - 1)
    return tokens // block_size * block_size


def describe(requests: Sequence[TraceRequest]) -> dict[str, float]:
    """The figures that characterise a trace slice (the issue's table)."""
    inputs = [float(r.input_length) for r in requests]
    outputs = [float(r.output_length) for r in requests]
    blocks = sum(len(r.hash_ids) for r in requests)
    return {
        "requests": float(len(requests)),
        "span_s": requests[-1].at_s - requests[0].at_s,
        "input_p50": percentile(inputs, 50),
        "input_p90": percentile(inputs, 90),
        "input_max": max(inputs),
        "output_p50": percentile(outputs, 50),
        "output_p90": percentile(outputs, 90),
        "reused_block_share": sum(reused_blocks(requests)) / blocks if blocks else 0.0,
    }


def size_class(tokens: int) -> str:
    return next(name for name, bound in SIZE_CLASSES if tokens < bound)


def sessions(requests: Sequence[TraceRequest]) -> list[int]:
    """Each request's session number (see the module docstring)."""
    latest: dict[tuple[int, ...], int] = {}
    numbers: list[int] = []
    opened = 0
    for request in requests:
        ids = request.hash_ids
        session = None
        for length in range(len(ids), MIN_SESSION_BLOCKS - 1, -1):
            session = latest.get(ids[:length])
            if session is not None:
                break
        if session is None:
            session, opened = opened, opened + 1
        numbers.append(session)
        full = len(ids) - (request.input_length % request.block_tokens != 0)
        if full >= MIN_SESSION_BLOCKS:
            latest[ids[:full]] = session
    return numbers


class TracePrompt:
    """A trace request's prompt, rendered when it is sent (a whole trace's text would not
    fit in memory at once)."""

    __slots__ = ("_request", "_text")

    def __init__(self, request: TraceRequest, text: TraceText) -> None:
        self._request = request
        self._text = text

    @property
    def tokens(self) -> int:
        return self._request.input_length

    def messages(self) -> tuple[Message, ...]:
        return ({"role": "user", "content": self._text.prompt(self._request)},)


class TraceText:
    """The text of trace blocks: 512 single-token words per hash id, drawn by a generator
    seeded with the id, so that the same id is the same text in every process."""

    def __init__(
        self,
        vocabulary: Sequence[str],
        seed: int,
        cache_blocks: int = 4096,
        block_tokens: int = TRACE_BLOCK_TOKENS,
    ) -> None:
        self._words = [" " + word for word in vocabulary]
        self._seed = seed
        self._cache: OrderedDict[int, list[str]] = OrderedDict()
        self._cache_blocks = cache_blocks
        self._block_tokens = block_tokens

    def block(self, hash_id: int) -> list[str]:
        words = self._cache.get(hash_id)
        if words is None:
            rng = random.Random(f"trace-block-{self._seed}-{hash_id}")
            words = rng.choices(self._words, k=self._block_tokens)
            self._cache[hash_id] = words
            if len(self._cache) > self._cache_blocks:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(hash_id)
        return words

    def prompt(self, request: TraceRequest) -> str:
        words: list[str] = []
        for hash_id in request.hash_ids:
            words += self.block(hash_id)
        return "".join(words[: request.input_length])


def trace_script(spec: TraceSpec, seed: int, vocabulary: Sequence[str]) -> Script:
    """The script of a trace slice: one one-turn conversation per request, at its time."""
    requests = load_trace(spec)
    text = TraceText(vocabulary, seed, block_tokens=spec.block_tokens)
    numbers = sessions(requests)
    conversations = tuple(
        Conversation(f"s{session:05d}", size_class(request.input_length),
                     (ScriptTurn((), request.output_length, 0.0,
                                 prompt=TracePrompt(request, text)),))
        for request, session in zip(requests, numbers, strict=True)
    )  # fmt: skip
    blocks = len({block for request in requests for block in request.hash_ids})
    return Script(spec.name, conversations, {}, seed, arrivals=tuple(r.at_s for r in requests),
                  trace_blocks=blocks, trace_block_tokens=requests[0].block_tokens)  # fmt: skip
