"""A chat template rendered as `transformers` renders it for vLLM.

The environment is transformers' (`utils/chat_template_utils.py`): a sandboxed, immutable
Jinja2 environment with `trim_blocks` and `lstrip_blocks`, loop controls, the
`{% generation %}` tag, a `tojson` filter that keeps non-ASCII text and takes `indent`,
`separators` and `sort_keys`, and the globals `raise_exception` and `strftime_now`. The
template sees `messages`, `tools`, `documents`, `add_generation_prompt`, the tokenizer's
named special tokens (`bos_token`, `eos_token`, …) and the request's template arguments.

Two properties of a template change what vLLM gives it, and are read from its syntax tree
as vLLM reads them: whether it iterates over a message's content (then content stays a
list of parts: the "openai" format; else parts are joined into a string), and whether it
mentions the `developer` role (else developer messages become system messages).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Mapping
from datetime import datetime
from functools import cached_property
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from tokenization.errors import ChatRenderError


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` (marks assistant text for training masks):
    renders its body unchanged, as transformers does when no mask is asked for."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's declaration

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(pattern: str) -> str:
    return datetime.now().strftime(pattern)


def environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """One compiled chat template."""

    def __init__(self, source: str, env: jinja2.sandbox.ImmutableSandboxedEnvironment) -> None:
        self.source = source
        try:
            self._ast = env.parse(source)
            self._compiled = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatRenderError(f"the chat template does not compile: {exc}") from None

    @cached_property
    def content_format(self) -> str:
        """ "openai" when the template loops over a message's content, else "string"."""
        return "openai" if next(_content_loops(self._ast), None) is not None else "string"

    @cached_property
    def supports_developer(self) -> bool:
        return '"developer"' in self.source or "'developer'" in self.source

    def render(self, variables: Mapping[str, Any]) -> str:
        try:
            return self._compiled.render(**variables)
        except jinja2.TemplateError as exc:
            raise ChatRenderError(str(exc)) from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise ChatRenderError(f"the chat template failed: {exc}") from None
        except RecursionError:
            raise ChatRenderError("the chat template recursed too deeply") from None


# -- what vLLM reads from the template's syntax tree -----------------------------------------


def _is_name(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_field(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            _is_name(node.node, name)
            and isinstance(node.arg, jinja2.nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _reads(node: jinja2.nodes.Node | None, name: str, key: str | None = None) -> bool:
    """`node` is `name` (or `name[key]` / `name.key`), possibly filtered, tested or sliced."""
    if node is None:
        return False
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return _reads(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _reads(node.node, name, key)
    return _is_field(node, name, key) if key else _is_name(node, name)


def _aliases(root: jinja2.nodes.Node, name: str) -> Iterator[str]:
    """`name` and every variable assigned from it (transitively)."""
    yield name
    pending = deque([name])
    seen = {name}
    while pending:
        current = pending.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            target = assign.target
            if (
                isinstance(target, jinja2.nodes.Name)
                and target.name not in seen
                and _reads(assign.node, current)
            ):
                seen.add(target.name)
                pending.append(target.name)
                yield target.name


def _message_variables(root: jinja2.nodes.Node) -> list[str]:
    """The loop variables of `{% for message in messages %}` (or an alias of messages)."""
    names = list(_aliases(root, "messages"))
    found = []
    for loop in root.find_all(jinja2.nodes.For):
        if isinstance(loop.target, jinja2.nodes.Name) and any(_reads(loop.iter, n) for n in names):
            found.append(loop.target.name)
    return found


def _content_loops(root: jinja2.nodes.Node) -> Iterator[jinja2.nodes.For]:
    """Loops over a message's content: `for part in message['content']`, over a macro
    parameter that is passed a message's content, or over a variable named `content`
    outside macros."""
    messages = _message_variables(root)
    content_params: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        params = {arg.name for arg in macro.args}
        passed: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for index, arg in enumerate(call.args):
                if index < len(macro.args) and any(_reads(arg, m, "content") for m in messages):
                    passed.add(macro.args[index].name)
            for keyword in call.kwargs:
                if keyword.key in params and any(
                    _reads(keyword.value, m, "content") for m in messages
                ):
                    passed.add(keyword.key)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if passed:
                content_params[id(loop)] = passed
    for loop in root.find_all(jinja2.nodes.For):
        if not isinstance(loop.target, jinja2.nodes.Name):
            continue
        iterated = loop.iter
        over_content = any(_reads(iterated, m, "content") for m in messages)
        over_parameter = isinstance(iterated, jinja2.nodes.Name) and (
            iterated.name in content_params.get(id(loop), ())
            or (id(loop) not in in_macros and iterated.name == "content")
        )
        if over_content or over_parameter:
            yield loop
