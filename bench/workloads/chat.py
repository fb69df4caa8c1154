"""Multi-turn chat sessions sharing a few large system prompts (deterministic per seed).

What makes prefix-aware routing matter: sessions share long system prompts, and turn k's
prompt extends turn k-1's (plus its answer), so each session's prefix keeps growing. User
messages and answers are log-normal (as in public chat traces), think times exponential
and starts spread, so requests do not arrive in lock step. Words are single tokens for
kvgate's simulated tokenizer, so words ≈ tokens.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

# Words the simulated engine's tokenizer holds as single tokens.
WORDS = (
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on",
    "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had",
    "by", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there",
    "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their",
    "time", "if", "will", "way", "about", "many", "then", "them", "write", "would", "like", "so",
    "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day",
    "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know",
    "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "any",
    "new", "work", "part", "take", "get", "place", "made", "live", "where", "after", "back",
    "little", "only", "round", "man", "year", "came", "show", "every", "good", "me", "give",
    "our", "under", "name", "very", "through", "just", "form", "sentence", "great", "think",
    "say", "help", "low", "line", "differ", "turn", "cause", "much", "mean", "before", "move",
    "right", "boy", "old", "too", "same", "tell", "does", "set", "three", "want", "air", "well",
    "also", "play", "small", "end", "put", "home", "read", "hand", "port", "large", "spell",
    "add", "even", "land", "here", "must", "big", "high", "such", "follow", "act", "why", "ask",
    "men", "change", "went", "light", "kind", "off", "need", "house", "picture", "try", "us",
    "again", "animal", "point", "mother", "world", "near", "build", "self", "earth", "father",
    "model", "cache", "token", "prefix", "block", "request", "engine", "event", "hash", "route",
    "assistant", "user", "system", "helpful", "answer", "question", "explain", "tree", "radix",
    "value", "key", "store", "memory", "data",
)  # fmt: skip
# Template tokens around each message (`<|role|>`, newline, `<|end|>`, newline).
MESSAGE_OVERHEAD_TOKENS = 4


@dataclass(frozen=True, slots=True)
class ChatWorkloadConfig:
    sessions: int = 16
    turns: int = 8
    system_prompts: int = 3
    system_words: int = 1024
    user_words_median: int = 120
    user_words_sigma: float = 0.6
    user_words_max: int = 800
    answer_tokens_median: int = 40
    answer_tokens_sigma: float = 0.5
    answer_tokens_max: int = 160
    think_s_mean: float = 2.0
    """Mean think time between a session's turns, in model seconds (exponential)."""
    start_spread_s: float = 4.0
    """Sessions start uniformly within this many model seconds."""
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("sessions", "turns", "system_prompts", "system_words", "user_words_median")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("user_words_max", "answer_tokens_median", "answer_tokens_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("user_words_sigma", "answer_tokens_sigma", "think_s_mean", "start_spread_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Turn:
    user: str
    """The new user message of this turn."""
    max_tokens: int
    """Answer length asked for (the simulated engine always generates exactly this many)."""
    think_s: float
    """Model seconds the user waits after this turn's answer before the next turn."""


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    system: int
    """Index of the session's system prompt in `ChatWorkload.system_prompts`."""
    start_s: float
    """Model seconds after the start of the run when the first turn is sent."""
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class ChatWorkload:
    config: ChatWorkloadConfig
    system_prompts: tuple[str, ...]
    sessions: tuple[Session, ...]

    @property
    def requests(self) -> int:
        return sum(len(session.turns) for session in self.sessions)

    def messages(self, session: Session, turn: int, answers: Sequence[str]) -> list[dict[str, str]]:
        """The chat messages of `session`'s turn `turn` (0-based), given the answers of its
        earlier turns (`answers[i]` answered turn i)."""
        if len(answers) < turn:
            raise ValueError(f"turn {turn} needs {turn} earlier answers, got {len(answers)}")
        messages = [{"role": "system", "content": self.system_prompts[session.system]}]
        for index in range(turn):
            messages.append({"role": "user", "content": session.turns[index].user})
            messages.append({"role": "assistant", "content": answers[index]})
        messages.append({"role": "user", "content": session.turns[turn].user})
        return messages

    def session_tokens(self, session: Session) -> int:
        """Estimated tokens of the session's longest context (last prompt plus answer),
        system prompt included."""
        tokens = len(self.system_prompts[session.system].split()) + MESSAGE_OVERHEAD_TOKENS
        for turn in session.turns:
            tokens += len(turn.user.split()) + turn.max_tokens + 2 * MESSAGE_OVERHEAD_TOKENS
        return tokens

    def working_set_tokens(self) -> int:
        """Estimated KV tokens to hold every session's whole context at once: each system
        prompt once, plus every session's own part."""
        system = sum(len(p.split()) + MESSAGE_OVERHEAD_TOKENS for p in self.system_prompts)
        own = sum(
            self.session_tokens(s)
            - len(self.system_prompts[s.system].split())
            - MESSAGE_OVERHEAD_TOKENS
            for s in self.sessions
        )
        return system + own

    def longest_request_tokens(self) -> int:
        """Estimated tokens (prompt plus answer) of the largest single request."""
        return max(self.session_tokens(s) for s in self.sessions)


def generate(config: ChatWorkloadConfig) -> ChatWorkload:
    """The workload of `config`; identical for identical configs (seed included)."""
    rng = random.Random(config.seed)
    systems = tuple(_system_prompt(rng, index, config.system_words) for index in range(
        config.system_prompts
    ))  # fmt: skip
    sessions = tuple(_session(rng, config, index) for index in range(config.sessions))
    return ChatWorkload(config=config, system_prompts=systems, sessions=sessions)


def _system_prompt(rng: random.Random, index: int, words: int) -> str:
    # A distinct opening, so two system prompts share no block.
    head = f"System prompt {index}: you are a helpful assistant."
    return head + " " + _text(rng, max(1, words - 8))


def _session(rng: random.Random, config: ChatWorkloadConfig, index: int) -> Session:
    system = rng.randrange(config.system_prompts)
    start = rng.uniform(0.0, config.start_spread_s)
    turns = tuple(_turn(rng, config) for _ in range(config.turns))
    return Session(session_id=f"s{index:04d}", system=system, start_s=start, turns=turns)


def _turn(rng: random.Random, config: ChatWorkloadConfig) -> Turn:
    words = _lognormal(rng, config.user_words_median, config.user_words_sigma)
    answer = _lognormal(rng, config.answer_tokens_median, config.answer_tokens_sigma)
    think = rng.expovariate(1.0 / config.think_s_mean) if config.think_s_mean > 0 else 0.0
    return Turn(
        user=_text(rng, min(words, config.user_words_max)),
        max_tokens=min(answer, config.answer_tokens_max),
        think_s=think,
    )


def _lognormal(rng: random.Random, median: int, sigma: float) -> int:
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))
