"""A benchmark workload as a script: conversations of fully written requests.

Every request is decided in advance (messages, answer length, think time after it), so a
script is the same for every router and the load generator needs no answer to build the
next turn: a turn's history carries the answers the generator wrote for the earlier turns
(as replayed chat traces do). A turn therefore extends the previous turn's prompt, and the
engine that served that prompt holds all of it but the last partial block.

Open loop (`schedule`), every request has a fixed send time, as in a trace replay: the
conversations start at Poisson times and turn k+1 is sent a nominal answer time plus the
think time after turn k, whether or not turn k was answered (its history is already
written). So every router gets the same requests at the same times, and the offered rate
does not depend on how fast a router answers. Closed loop: see `bench/routing/loadgen.py`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Template tokens around each message (`<|role|>`, newline, `<|end|>`, newline).
MESSAGE_OVERHEAD_TOKENS = 4
TOOL_CALL_TOKENS = 25
"""Template tokens of one of an assistant's tool calls, as the agent workload writes them
(`<tool_call>{"name": "tool_0", "arguments": {}}</tool_call>`)."""
TOOL_RESULT_TOKENS = 10
"""Template tokens around a tool's answer (`<tool_result>`, `</tool_result>`)."""

Message = dict[str, Any]
"""An OpenAI chat message: role and content, and an agent's tool calls and their ids."""


class LazyPrompt(Protocol):
    """A prompt rendered only when it is sent (a trace's), with its size known before."""

    @property
    def tokens(self) -> int: ...

    def messages(self) -> tuple[Message, ...]: ...


@dataclass(frozen=True, slots=True)
class ScriptTurn:
    messages: tuple[Message, ...]
    """The whole request: system prompt, history, new user message."""
    max_tokens: int
    think_s: float
    """Model seconds the client waits after this turn's answer before its next turn."""
    prompt: LazyPrompt | None = None
    """Instead of `messages`: a prompt rendered when sent."""

    def prompt_tokens(self) -> int:
        """Estimated prompt tokens (one per word, as the simulated tokenizer counts them,
        and the chat template's around each message)."""
        if self.prompt is not None:
            return self.prompt.tokens
        return sum(_tokens(m) for m in self.messages)

    def request_messages(self) -> list[Message]:
        """The messages to send."""
        return list(self.prompt.messages() if self.prompt is not None else self.messages)


@dataclass(frozen=True, slots=True)
class Conversation:
    conversation_id: str
    tag: str
    """Traffic class (`chat`, `agent`, `vip`, `flood`, `unique`): results are split by it."""
    turns: tuple[ScriptTurn, ...]
    shared_prefix: str | None = None
    """Name of the prefix it shares with other conversations (a system prompt), if any."""


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    conversations: tuple[Conversation, ...]
    shared_prefixes: dict[str, int]
    """Tokens of each shared prefix (counted once in the working set)."""
    seed: int
    arrivals: tuple[float, ...] = ()
    """A replayed trace's: each conversation's send time (model seconds at the trace's own
    pace); empty: conversations start at Poisson times (`schedule`)."""
    trace_blocks: int = 0
    """A replayed trace's distinct prompt blocks, of `trace_block_tokens` each."""
    trace_block_tokens: int = 0

    @property
    def requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    def tags(self) -> list[str]:
        return sorted({c.tag for c in self.conversations})

    def working_set_tokens(self) -> int:
        """KV tokens to hold every conversation's whole context at once: each shared
        prefix once, plus every conversation's own part (its last prompt and answer); a
        trace's distinct prompt blocks."""
        if self.trace_blocks:
            return self.trace_blocks * self.trace_block_tokens
        total = sum(self.shared_prefixes.values())
        for conversation in self.conversations:
            last = conversation.turns[-1]
            own = last.prompt_tokens() + last.max_tokens
            if conversation.shared_prefix is not None:
                own -= self.shared_prefixes[conversation.shared_prefix]
            total += max(0, own)
        return total

    def longest_request_tokens(self) -> int:
        return max(t.prompt_tokens() + t.max_tokens for c in self.conversations for t in c.turns)

    def mean_turns(self) -> float:
        return self.requests / len(self.conversations) if self.conversations else 0.0

    @property
    def natural_rate(self) -> float:
        """A trace's own rate: requests per second of its span."""
        span = self.arrivals[-1] - self.arrivals[0] if self.arrivals else 0.0
        return self.requests / span if span > 0 else float(self.requests)


def nominal_answer_s(turn: ScriptTurn) -> float:
    """Model seconds a light-loaded engine takes to answer `turn` (a warm prefill, then
    one decode step of ~30 ms per token): the gap before the next turn's think time."""
    return 0.1 + 0.03 * turn.max_tokens


def schedule(script: Script, rate: float, seed: int) -> list[tuple[float, int, int]]:
    """(send time in model seconds, conversation index, turn index) of every request, in
    time order, for an offered `rate` in requests per model second. A trace keeps its own
    arrivals, their pace scaled to `rate` (`trace_speed`)."""
    if script.arrivals:
        speed = trace_speed(script, rate)
        origin = script.arrivals[0]
        return [((at - origin) / speed, index, 0) for index, at in enumerate(script.arrivals)]
    starts = poisson_starts(len(script.conversations), rate / script.mean_turns(), seed)
    sends = []
    for index, (conversation, start) in enumerate(zip(script.conversations, starts, strict=True)):
        at = start
        for turn_index, turn in enumerate(conversation.turns):
            sends.append((at, index, turn_index))
            at += nominal_answer_s(turn) + turn.think_s
    return sorted(sends)


def trace_speed(script: Script, rate: float) -> float:
    """How many times faster than recorded a trace is replayed to offer `rate`."""
    return rate / script.natural_rate


def poisson_starts(count: int, rate: float, seed: int) -> list[float]:
    """`count` start times (seconds) of a Poisson process of `rate` per second."""
    rng = random.Random(seed)
    now, starts = 0.0, []
    for _ in range(count):
        starts.append(now)
        now += rng.expovariate(rate)
    return starts


def _tokens(message: Message) -> int:
    tokens = len(message["content"].split()) + MESSAGE_OVERHEAD_TOKENS
    tokens += TOOL_CALL_TOKENS * len(message.get("tool_calls") or ())
    return tokens + (TOOL_RESULT_TOKENS if message["role"] == "tool" else 0)


def lognormal_int(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))


def words(rng: random.Random, vocabulary: Sequence[str], count: int) -> str:
    return " ".join(rng.choice(vocabulary) for _ in range(count))
