"""The routing benchmark's workloads, each a deterministic generator of a `Script` (one
`random.Random` per workload, seeded from `seed`; words the simulated tokenizer holds as
single tokens, so words ≈ tokens). What each one tests:

`chat` (the demo's generator, answers written into the history): whether affinity keeps
growing conversations warm; `agent`: long loops of short steps appending tool output;
`vip-flood`: whether affinity keeps VIP contexts warm while unique one-shots churn the
caches; `unique`: nothing to share, so prefix routing must cost nothing; `hetero`: the
chat script on a fleet whose slow half a router must send less; `one-prompt`: one shared
system prompt on a small fleet, where following the prefix alone piles everything onto
one engine.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.routing.script import (
    MESSAGE_OVERHEAD_TOKENS,
    Conversation,
    Message,
    Script,
    ScriptTurn,
    lognormal_int,
    words,
)
from bench.routing.trace import TraceSpec, trace_script
from bench.workloads.chat import WORDS as VOCABULARY  # the demo's single-token words
from bench.workloads.chat import ChatWorkloadConfig, generate

WORKLOADS = ("chat", "agent", "vip-flood", "unique", "hetero", "one-prompt")
HETERO_SLOWDOWN = 2.0
"""How much slower the slow half of the `hetero` fleet is, at prefill and at decode."""


def slowdown(name: str) -> float:
    """The slow half's slowdown of workload `name`'s fleet (1.0: every engine alike)."""
    return HETERO_SLOWDOWN if name == "hetero" else 1.0


@dataclass(frozen=True, slots=True)
class WorkloadSize:
    """How big a script is; the defaults are the benchmark's, tests use smaller ones."""

    conversations: int = 160
    turns: int = 5
    system_words: int = 1536
    user_words_median: int = 200
    answer_tokens_median: int = 24
    think_s_mean: float = 0.5
    """Mean model seconds between a chat answer and the user's next turn (exponential)."""


def script_of(
    name: str,
    size: WorkloadSize,
    seed: int,
    trace: TraceSpec | None = None,
    vocabulary: tuple[str, ...] | None = None,
) -> Script:
    """The script of workload `name`: a replayed `trace` (its prompts in words of
    `vocabulary`, each one token for the engines' tokenizer: by default the simulator's),
    or one of `WORKLOADS`."""
    if trace is not None:
        return trace_script(trace, seed, vocabulary or VOCABULARY)
    return build(name, size, seed)


def build(name: str, size: WorkloadSize, seed: int) -> Script:
    """The script of workload `name` (one of `WORKLOADS`)."""
    builders: dict[str, Callable[[WorkloadSize, int], Script]] = {
        "chat": chat,
        "agent": agent,
        "vip-flood": vip_flood,
        "unique": unique,
        "hetero": hetero,
        "one-prompt": one_prompt,
    }
    if name not in builders:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return builders[name](size, seed)


def chat(size: WorkloadSize, seed: int) -> Script:
    """(a) Multi-turn chat sharing 4 system prompts; answers written from the session's rng."""
    return _chat(size, seed, "chat", system_prompts=4)


def hetero(size: WorkloadSize, seed: int) -> Script:
    """(e) The chat script, under its own name: the fleet makes the difference."""
    return dataclasses.replace(chat(size, seed), name="hetero")


def one_prompt(size: WorkloadSize, seed: int) -> Script:
    """(f) Multi-turn chat, every conversation on the same system prompt."""
    return _chat(size, seed, "one-prompt", system_prompts=1)


def _chat(size: WorkloadSize, seed: int, name: str, *, system_prompts: int) -> Script:
    config = ChatWorkloadConfig(
        sessions=size.conversations,
        turns=size.turns,
        system_prompts=system_prompts,
        system_words=size.system_words,
        user_words_median=size.user_words_median,
        user_words_max=4 * size.user_words_median,
        answer_tokens_median=size.answer_tokens_median,
        answer_tokens_max=4 * size.answer_tokens_median,
        think_s_mean=size.think_s_mean,
        start_spread_s=0.0,
        seed=seed,
    )
    workload = generate(config)
    rng = random.Random(f"chat-answers-{seed}")
    conversations = []
    for session in workload.sessions:
        answers: list[str] = []
        turns = []
        for index, turn in enumerate(session.turns):
            messages = workload.messages(session, index, answers)
            turns.append(ScriptTurn(tuple(messages), turn.max_tokens, turn.think_s))
            answers.append(words(rng, VOCABULARY, turn.max_tokens))
        conversations.append(
            Conversation(session.session_id, "chat", tuple(turns), f"system-{session.system}")
        )
    shared = {
        f"system-{i}": len(p.split()) + MESSAGE_OVERHEAD_TOKENS
        for i, p in enumerate(workload.system_prompts)
    }
    return Script(name, tuple(conversations), shared, seed)


def agent(size: WorkloadSize, seed: int) -> Script:
    """(b) Agentic loops: 2 tool specs shared, ~3× the turns, tool output appended each step."""
    rng = random.Random(f"agent-{seed}")
    specs = [
        f"Agent tools {i}: call a tool by name. " + words(rng, VOCABULARY, size.system_words)
        for i in range(2)
    ]
    conversations = []
    for index in range(size.conversations):
        spec = rng.randrange(len(specs))
        steps = lognormal_int(rng, 3 * size.turns, 0.4, 6 * size.turns)
        messages: list[Message] = [
            {"role": "system", "content": specs[spec]},
            {"role": "user", "content": words(rng, VOCABULARY, size.user_words_median)},
        ]
        turns = []
        for step in range(steps):
            call = lognormal_int(rng, 16, 0.4, 64)
            turns.append(ScriptTurn(tuple(messages), call, rng.expovariate(1 / 0.3)))
            # As OpenAI's API has it: the assistant's message names its tool call, and the
            # tool's answer names the call it answers (sglang-router refuses one without).
            call_id = f"call-{index:04d}-{step:03d}"
            function = {"name": f"tool_{spec}", "arguments": "{}"}
            messages.append(
                {
                    "role": "assistant",
                    "content": words(rng, VOCABULARY, call),
                    "tool_calls": [{"id": call_id, "type": "function", "function": function}],
                }
            )
            output = lognormal_int(rng, size.user_words_median / 2, 0.8, 4 * size.user_words_median)
            tool_output = words(rng, VOCABULARY, output)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_output})
        conversations.append(Conversation(f"a{index:04d}", "agent", tuple(turns), f"tools-{spec}"))
    shared = {f"tools-{i}": len(s.split()) + MESSAGE_OVERHEAD_TOKENS for i, s in enumerate(specs)}
    return Script("agent", tuple(conversations), shared, seed)


def vip_flood(size: WorkloadSize, seed: int) -> Script:
    """(c) A quarter of the conversations are VIP chats (1 system prompt, 2× the turns); the
    rest of the requests (60 % of all) are one-shot floods with unique prompts."""
    rng = random.Random(f"vip-flood-{seed}")
    vip_system = "VIP desk: you are the premium assistant. " + words(
        rng, VOCABULARY, size.system_words
    )
    vips = max(1, size.conversations // 4)
    turns_each = 2 * size.turns
    conversations: list[Conversation] = []
    for index in range(vips):
        messages: list[Message] = [{"role": "system", "content": vip_system}]
        turns = []
        for _ in range(turns_each):
            user = lognormal_int(rng, size.user_words_median, 0.6, 4 * size.user_words_median)
            messages.append({"role": "user", "content": words(rng, VOCABULARY, user)})
            answer = lognormal_int(rng, size.answer_tokens_median, 0.5, 160)
            turns.append(
                ScriptTurn(tuple(messages), answer, rng.expovariate(1 / size.think_s_mean))
            )
            messages.append({"role": "assistant", "content": words(rng, VOCABULARY, answer)})
        conversations.append(Conversation(f"v{index:04d}", "vip", tuple(turns), "vip-system"))
    floods = round(vips * turns_each * 1.5)
    for index in range(floods):
        conversations.append(_one_shot(rng, f"f{index:05d}", "flood", size))
    rng.shuffle(conversations)
    shared = {"vip-system": len(vip_system.split()) + MESSAGE_OVERHEAD_TOKENS}
    return Script("vip-flood", tuple(conversations), shared, seed)


def unique(size: WorkloadSize, seed: int) -> Script:
    """(d) One-shot requests, every prompt unique from its first block on."""
    rng = random.Random(f"unique-{seed}")
    count = 2 * size.conversations  # independent requests: fewer make a stable p90
    conversations = tuple(_one_shot(rng, f"u{i:05d}", "unique", size) for i in range(count))
    return Script("unique", conversations, {}, seed)


def _one_shot(rng: random.Random, cid: str, tag: str, size: WorkloadSize) -> Conversation:
    # Lengths like a chat turn with its context: a few system-prompts' worth of words.
    length = lognormal_int(rng, size.system_words, 0.5, 4 * size.system_words)
    prompt = words(rng, VOCABULARY, length)
    answer = lognormal_int(rng, size.answer_tokens_median, 0.5, 160)
    turn = ScriptTurn(({"role": "user", "content": prompt},), answer, 0.0)
    return Conversation(cid, tag, (turn,))
