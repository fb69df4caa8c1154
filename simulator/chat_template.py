"""The simulated model's chat template: messages → token ids.

One function serves `/tokenize` with `messages` and generation, so the gateway's remote
tokenizer sees exactly the tokens the engine caches (the same shape as the captured vLLM
model's template):

    [<s>] ( <|role|> "\\n" content <|end|> "\\n" )*  [ <|assistant|> "\\n" ]

`<s>` only when `add_special_tokens` is true (vLLM's default for chat is false); the
assistant header only when `add_generation_prompt` is true (vLLM's default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from simulator.tokenizer import ASSISTANT_ID, BOS_ID, END_ID, SYSTEM_ID, USER_ID, SimTokenizer

_ROLE_IDS: dict[str, int] = {
    "system": SYSTEM_ID,
    "developer": SYSTEM_ID,
    "user": USER_ID,
    "assistant": ASSISTANT_ID,
    "tool": USER_ID,
}


class ChatTemplateError(ValueError):
    """A message list the template cannot render (unknown role, bad content)."""


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one message; OpenAI content parts of type `text` are concatenated."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ChatTemplateError(f"unsupported content part: {part!r}")
        return "".join(parts)
    raise ChatTemplateError(f"message content must be a string or a list, got {content!r}")


class ChatTemplate:
    """Renders chat messages into token ids with a `SimTokenizer`."""

    def __init__(self, tokenizer: SimTokenizer) -> None:
        self._tokenizer = tokenizer

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        add_special_tokens: bool = False,
    ) -> list[int]:
        if not messages:
            raise ChatTemplateError("messages must not be empty")
        newline = self._tokenizer.encode("\n")
        ids: list[int] = [BOS_ID] if add_special_tokens else []
        for message in messages:
            if not isinstance(message, Mapping):
                raise ChatTemplateError(f"each message must be an object, got {message!r}")
            role = message.get("role")
            role_id = _ROLE_IDS.get(str(role))
            if role_id is None:
                raise ChatTemplateError(f"unknown message role: {role!r}")
            ids.append(role_id)
            ids.extend(newline)
            ids.extend(self._tokenizer.encode(message_text(message)))
            ids.append(END_ID)
            ids.extend(newline)
        if add_generation_prompt:
            ids.append(ASSISTANT_ID)
            ids.extend(newline)
        return ids
