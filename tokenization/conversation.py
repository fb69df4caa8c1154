"""An OpenAI chat request's messages and tools as vLLM hands them to a chat template.

vLLM (0.32) does not give the template the client's messages as sent; it rebuilds each one
(`vllm/renderers/chat_utils.py`), and the rendered prompt, so the token ids, depend on
exactly how:

- `content`: a string, `null` (no parts) or a list of parts. Text parts (`text`,
  `input_text`, `output_text`, `refusal`, `thinking`) are joined with "\\n" into one string
  when the template reads content as a string, or kept as `{"type": "text", "text": …}`
  parts when it iterates over content ("openai" format; `ChatTemplate.content_format`).
  A system message's part starting with Claude Code's billing header loses that line.
- Only `role`, `content`, `name`, `task`, an assistant's `tool_calls` and `reasoning`
  (also as `reasoning_content`), a tool's `tool_call_id` and a developer's `tools` reach
  the template; anything else a client sends is dropped.
- A tool call's `arguments` JSON string becomes an object (`{}` when it is empty, not JSON
  or not an object); an empty `tool_calls` list is removed.
- Tools are the request's function definitions with vLLM's fields only:
  `{"type": "function", "function": {"name", "description", "parameters"[, "strict"]}}`.

Media parts (images, audio, video, embeddings) are not text: `NotRenderable`, and the
gateway leaves the request to the engine.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from tokenization.errors import ChatRenderError, NotRenderable

TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
"""Content part types vLLM reads as text, and the key holding the text."""
_KNOWN_PART_FIELDS = frozenset(
    {"type", "text", "refusal", "thinking", "uuid", "image_url", "input_audio", "audio_url",
     "video_url", "image_embeds", "audio_embeds", "video_embeds", "image_pil", "data", "name",
     "closed", "signature", "file", "file_id", "detail"}
)  # fmt: skip
"""Fields of a content part that vLLM's part types declare; others ride along in the
"openai" format (vLLM's `_collect_extra_fields`)."""
CLAUDE_CODE_BILLING_HEADER = "x-anthropic-billing-header"


def conversation(messages: Any, content_format: str) -> list[dict[str, Any]]:
    """The messages as the template sees them (`content_format`: "string" or "openai")."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ChatRenderError("messages must be a non-empty list")
    result = [_message(message, content_format) for message in messages]
    _parse_tool_call_arguments(result)
    return result


def _message(message: Any, content_format: str) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ChatRenderError(f"each message must be an object, got {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str):
        raise ChatRenderError("each message needs a string role")
    content = message.get("content")
    parts: list[Any]
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
    else:
        raise ChatRenderError("message content must be a string, a list of parts or null")
    if role == "system":
        parts = _strip_billing_header(parts)
    texts = [text for text in (_part(part, content_format) for part in parts) if text is not None]
    out: dict[str, Any] = {"role": role}
    if content_format == "openai":
        out["content"] = texts
    else:
        out["content"] = "\n".join(str(text) for text in texts)
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise ChatRenderError("tool_calls must be a list")
            out["tool_calls"] = copy.deepcopy(tool_calls)
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        if isinstance(out["content"], list) and all(
            isinstance(item, Mapping) and item.get("type") == "text" for item in out["content"]
        ):
            out["content"] = "\n".join(str(item.get("text", "")) for item in out["content"])
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if isinstance(message.get("task"), str):
        out["task"] = message["task"]
    if role == "developer":
        out["tools"] = copy.deepcopy(message.get("tools"))
    return out


def _part(part: Any, content_format: str) -> Any:
    """One content part as text (string format) or a text part (openai format); None
    when vLLM skips it (a text part without text)."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if content_format == "openai" else part
    if not isinstance(part, Mapping):
        raise ChatRenderError("each content part must be a string or an object")
    kind = part.get("type")
    key = TEXT_PART_KEYS.get(kind) if isinstance(kind, str) else None
    if key is None or part.get("uuid") is not None:
        raise NotRenderable(f"content part of type {kind!r} (only text is rendered here)")
    text = part.get(key)
    if text is None:
        return None
    if not isinstance(text, str):
        raise ChatRenderError(f"a {kind} part's {key} must be a string")
    if content_format != "openai":
        return text
    wrapped: dict[str, Any] = {"type": "text", "text": text}
    wrapped.update({k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS})
    return wrapped


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    """Claude Code's attribution line changes on every request: vLLM drops it from system
    text so the rest of the prompt stays cacheable."""
    out: list[Any] = []
    for part in parts:
        text = part if isinstance(part, str) else None
        if isinstance(part, Mapping) and part.get("type") == "text":
            text = part.get("text")
        if not (isinstance(text, str) and text.startswith(CLAUDE_CODE_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _parse_tool_call_arguments(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        if message["role"] != "assistant" or "tool_calls" not in message:
            continue
        calls = message["tool_calls"]
        if not calls:
            del message["tool_calls"]
            continue
        for call in calls:
            if not isinstance(call, dict):
                raise ChatRenderError("assistant tool_calls entries must be objects")
            function = call.get("function")
            if call.get("type", "function") != "function" or not isinstance(function, dict):
                raise ChatRenderError("only assistant tool_calls of type 'function' are served")
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
                continue
            parsed = arguments
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except ValueError:
                    parsed = None
            function["arguments"] = parsed if isinstance(parsed, dict) else {}


def tool_definitions(tools: Any) -> list[dict[str, Any]] | None:
    """The request's `tools` as vLLM passes them to the template (its pydantic models'
    dump: declared fields only, absent optional ones as null, `strict` only when set)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatRenderError("tools must be a list")
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
            raise ChatRenderError("each tool must be an object with a function")
        if tool.get("type", "function") != "function":
            raise ChatRenderError("only tools of type 'function' are served")
        function = tool["function"]
        if not isinstance(function.get("name"), str):
            raise ChatRenderError("each tool function needs a string name")
        definition: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": copy.deepcopy(function.get("parameters")),
        }
        for optional in ("strict", "defer_loading"):
            if function.get(optional) is not None:
                definition[optional] = function[optional]
        entry: dict[str, Any] = {"type": "function", "function": definition}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
            definition.setdefault("defer_loading", tool["defer_loading"])
        out.append(entry)
    return out


def developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A template that knows no `developer` role gets those messages as `system`, all
    system messages merged into the first (vLLM's conversion)."""
    converted = []
    for message in messages:
        if message["role"] == "developer":
            message = {k: v for k, v in message.items() if k != "tools"}
            message["role"] = "system"
        converted.append(message)
    systems: list[str] = []
    others: list[dict[str, Any]] = []
    merge = False
    for index, message in enumerate(converted):
        if message["role"] != "system":
            others.append(message)
            continue
        if index > 0 or systems:
            merge = True
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                part["text"] if isinstance(part, dict) else part
                for part in content
                if isinstance(part, str) or (isinstance(part, dict) and "text" in part)
            )
        if content:
            systems.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(systems)}, *others]
