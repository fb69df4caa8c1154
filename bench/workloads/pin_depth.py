"""The pin-depth benchmark's traffic (seed 001's V5 shape, generated locally; docs/pinning.md).

Request j of the flood is turn `j // sessions` of session `j % sessions`, so consecutive
requests interleave the sessions like a concurrent load generator. Every text starts with
a unique tag, so two texts never share a prefix by chance; the same config gives the same
traffic, byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workloads.chat import WORDS

Message = dict[str, str]


@dataclass(frozen=True, slots=True)
class PinDepthWorkloadConfig:
    vip_system_words: int = 2_400
    vip_user_words: int = 1_100
    """User messages are long (pasted context), answers shorter: at depth D the measured
    turn adds one answer, as in the seed's history (93% cached at depth 0)."""
    vip_assistant_words: int = 300
    vip_messages: int = 18
    flood_system_words: int = 300
    flood_message_words: int = 60
    flood_turns: int = 24
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if name != "seed" and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _text(rng: random.Random, words: int, tag: str) -> str:
    # A unique tag first, so two texts never share a prefix by chance.
    return tag + " " + " ".join(rng.choice(WORDS) for _ in range(words - 1))


@dataclass(frozen=True, slots=True)
class VipConversation:
    system: str
    messages: tuple[str, ...]
    """Alternating user / assistant texts, user first."""

    def chat(self, upto: int) -> list[Message]:
        """The system prompt and messages 0..upto (inclusive)."""
        if not 0 <= upto < len(self.messages):
            raise ValueError(f"the conversation has {len(self.messages)} messages, not {upto + 1}")
        chat = [{"role": "system", "content": self.system}]
        for index, text in enumerate(self.messages[: upto + 1]):
            chat.append({"role": "user" if index % 2 == 0 else "assistant", "content": text})
        return chat


def vip_conversation(config: PinDepthWorkloadConfig) -> VipConversation:
    rng = random.Random(config.seed)
    system = _text(rng, config.vip_system_words, "vip-system")
    messages = tuple(
        _text(
            rng,
            config.vip_user_words if index % 2 == 0 else config.vip_assistant_words,
            f"vip-{index}",
        )
        for index in range(config.vip_messages)
    )
    return VipConversation(system, messages)


class FloodTraffic:
    """Flood requests on demand: request j is a turn of one of `sessions` sessions."""

    def __init__(self, config: PinDepthWorkloadConfig, sessions: int) -> None:
        if sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {sessions}")
        self.config = config
        self.sessions = sessions
        self._systems: list[str] = []
        self._messages: list[list[str]] = []
        rng = random.Random(config.seed + 1)
        for session in range(sessions):
            self._systems.append(_text(rng, config.flood_system_words, f"flood-{session}-system"))
            self._messages.append(
                [
                    _text(rng, config.flood_message_words, f"flood-{session}-{turn}")
                    for turn in range(2 * config.flood_turns)
                ]
            )

    @property
    def capacity(self) -> int:
        """Distinct requests before the traffic repeats itself."""
        return self.sessions * self.config.flood_turns

    def request(self, index: int) -> list[Message]:
        session, turn = index % self.sessions, (index // self.sessions) % self.config.flood_turns
        chat = [{"role": "system", "content": self._systems[session]}]
        for position, text in enumerate(self._messages[session][: 2 * turn + 1]):
            chat.append({"role": "user" if position % 2 == 0 else "assistant", "content": text})
        return chat


def trie_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """Distinct tokens a radix tree holds after all `prompts`: sum of lengths minus the
    prefix each shares with its lexicographic neighbour."""
    ordered = sorted(tuple(p) for p in prompts)
    total = 0
    previous: tuple[int, ...] = ()
    for prompt in ordered:
        shared = 0
        for a, b in zip(previous, prompt, strict=False):
            if a != b:
                break
            shared += 1
        total += len(prompt) - shared
        previous = prompt
    return total
