"""Token counts of a relayed answer, for `kvgate_prompt_tokens_total` and
`kvgate_completion_tokens_total`.

The engine's own `usage` object is the truth: vLLM and SGLang put it at the end of every
non-streamed answer, and in the last event of a stream when the client asked for it
(`stream_options.include_usage`). The relay keeps only its last few chunks (references,
no copies) and reads `usage` from them once the answer ends. A stream without it is
counted by the gateway instead: the prompt's tokens when the gateway tokenized it, and one
completion token per streamed event (vLLM and SGLang send one event per token by
default); the `source` label tells the two apart.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

_TAIL_CHUNKS = 3
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d{1,12})')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,12})')
_EVENT = b"data: {"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int
    source: str
    """`engine` (its `usage` object) or `gateway` (counted here)."""


class UsageMeter:
    def __init__(self) -> None:
        self._tail: deque[bytes] = deque(maxlen=_TAIL_CHUNKS)
        self._events = 0

    def feed(self, chunk: bytes) -> None:
        self._tail.append(chunk)
        self._events += chunk.count(_EVENT)

    def usage(self, gateway_prompt_tokens: int | None) -> Usage:
        """The answer's counts: the engine's last `usage`, else the gateway's own."""
        tail = b"".join(self._tail)
        prompts = _PROMPT.findall(tail)
        completions = _COMPLETION.findall(tail)
        if prompts and completions:
            return Usage(int(prompts[-1]), int(completions[-1]), "engine")
        return Usage(gateway_prompt_tokens, self._events, "gateway")
