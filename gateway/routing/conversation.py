"""What a chat request says of its conversation: whether it opens one, and how much of it
is a preamble it may share with others (its system prompt)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def opens_conversation(body: Mapping[str, Any]) -> bool:
    """A chat request with no answer in it yet: a new conversation's first turn."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    return not any(
        isinstance(m, Mapping) and m.get("role") in ("assistant", "tool", "function")
        for m in messages
    )


def preamble_share(body: Mapping[str, Any]) -> float:
    """The share of a chat's text in its leading system (or developer) messages: the part a
    new conversation may share with others (its system prompt), by characters."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0.0
    lengths = [len(message_text(m)) if isinstance(m, Mapping) else 0 for m in messages]
    preamble = 0
    for message, length in zip(messages, lengths, strict=True):
        if not isinstance(message, Mapping) or message.get("role") not in ("system", "developer"):
            break
        preamble += length
    total = sum(lengths)
    return preamble / total if total else 0.0


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its content, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""
