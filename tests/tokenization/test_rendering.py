"""Chat requests rendered as vLLM renders them: the conversation it builds from the
client's messages, the template's environment, and the arguments it passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tokenization import ChatRenderError, ModelTokenizer, NotRenderable, find_in_hub_cache

SIM_TOKENIZER = Path(__file__).resolve().parents[2] / "simulator" / "tokenizer"

STRING_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
PARTS_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]"
    "{% for part in m['content'] %}<{{ part['type'] }}:{{ part['text'] }}>{% endfor %}"
    "{% endfor %}"
)
ECHO_TEMPLATE = "{{ messages | tojson }}|{{ tools | tojson }}|{{ extra }}|{{ enable_thinking }}"


def model_dir(tmp_path: Path, template: str, **config: Any) -> Path:
    directory = tmp_path / "model"
    directory.mkdir(exist_ok=True)
    shutil.copy(SIM_TOKENIZER / "tokenizer.json", directory / "tokenizer.json")
    settings = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template, **config}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory


def load(tmp_path: Path, template: str, **config: Any) -> ModelTokenizer:
    return ModelTokenizer.load(model_dir(tmp_path, template, **config))


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **fields}


def test_text_parts_are_joined_by_newlines_for_a_string_template(tmp_path: Path) -> None:
    tokenizer = load(tmp_path, STRING_TEMPLATE)
    parts = [{"type": "text", "text": "a"}, "b", {"type": "input_text", "text": "c"}]
    rendered = tokenizer.render_chat(chat({"role": "user", "content": parts}))
    assert rendered == "[user]a\nb\nc\n[assistant]"
    none = tokenizer.render_chat(chat({"role": "assistant", "content": None}))
    assert none.startswith("[assistant]\n")


def test_a_template_that_loops_over_content_gets_the_parts(tmp_path: Path) -> None:
    tokenizer = load(tmp_path, PARTS_TEMPLATE)
    message = {"role": "user", "content": ["x", {"type": "text", "text": "y"}]}
    assert tokenizer.render_chat(chat(message)) == "[user]<text:x><text:y>"
    # a plain string becomes one text part too
    assert tokenizer.render_chat(chat({"role": "user", "content": "z"})) == "[user]<text:z>"


def test_developer_messages_become_one_system_message_when_the_template_lacks_the_role(
    tmp_path: Path,
) -> None:
    tokenizer = load(tmp_path, STRING_TEMPLATE)
    request = chat(
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "developer", "content": "d"},
        add_generation_prompt=False,
    )
    assert tokenizer.render_chat(request) == "[system]s\n\nd\n[user]u\n"
    knows = load(tmp_path, STRING_TEMPLATE + "{# 'developer' #}")
    assert "[developer]d" in knows.render_chat(request)


def test_tool_calls_arguments_become_objects_and_tools_carry_vllm_s_fields(
    tmp_path: Path,
) -> None:
    tokenizer = load(tmp_path, ECHO_TEMPLATE)
    calls = [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
        {"id": "3", "type": "function", "function": {"name": "h", "arguments": "[1]"}},
    ]
    tools = [{"type": "function", "function": {"name": "f", "extra": 1}, "ignored": True}]
    request = chat(
        {"role": "assistant", "content": "", "tool_calls": calls, "unknown": "dropped"},
        {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "42"}]},
        {"role": "user", "content": "u", "name": "ann"},
        {"role": "assistant", "content": "x", "tool_calls": []},
        tools=tools,
    )
    messages_json, tools_json, _, _ = tokenizer.render_chat(request).split("|")
    messages = json.loads(messages_json)
    assert [c["function"]["arguments"] for c in messages[0]["tool_calls"]] == [{"x": 1}, {}, {}]
    assert "unknown" not in messages[0]
    assert messages[1] == {"role": "tool", "content": "42", "tool_call_id": "1"}
    assert messages[2]["name"] == "ann"
    assert "tool_calls" not in messages[3]  # an empty list is dropped
    assert json.loads(tools_json) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}}
    ]
    # the client's body is not changed by the rendering
    assert request["messages"][0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'


def test_template_arguments_merge_as_vllm_merges_them(tmp_path: Path) -> None:
    tokenizer = load(tmp_path, ECHO_TEMPLATE)
    request = chat(
        {"role": "user", "content": "u"},
        chat_template_kwargs={"extra": "E", "tools": [{"name": "own"}]},
        tools=[{"type": "function", "function": {"name": "f"}}],
        reasoning_effort="low",
    )
    _, tools, extra, thinking = tokenizer.render_chat(request).split("|")
    assert json.loads(tools) == [{"name": "own"}]  # the template arguments' tools win
    assert extra == "E"
    assert thinking == "True"  # a reasoning effort turns thinking on, in chat completions
    assert tokenizer.render_chat(request, completions=False).split("|")[3] == ""


def test_continue_final_message_cuts_the_prompt_after_the_last_message(tmp_path: Path) -> None:
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</end>{% endfor %}"
    tokenizer = load(tmp_path, template)
    request = chat(
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "The answer is"},
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert tokenizer.render_chat(request) == "<user>q</end><assistant>The answer is"


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, ChatRenderError),
        ({"add_generation_prompt": True, "continue_final_message": True}, ChatRenderError),
        ({"add_generation_prompt": "yes"}, ChatRenderError),
        ({"messages": []}, ChatRenderError),
        ({"messages": [{"content": "no role"}]}, ChatRenderError),
        ({"chat_template_kwargs": {"tokenize": True}}, ChatRenderError),
        ({"tools": [{"type": "code_interpreter"}]}, ChatRenderError),
        ({"chat_template": "{{ messages }}"}, NotRenderable),
        ({"chat_template_kwargs": {"padding": True}}, NotRenderable),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            NotRenderable,
        ),
    ],
)
def test_what_vllm_refuses_and_what_only_the_engine_can_render(
    tmp_path: Path, fields: dict[str, Any], error: type[Exception]
) -> None:
    template = (
        "{% for m in messages %}{% if m['role'] == 'wizard' %}"
        "{{ raise_exception('no wizards') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    tokenizer = load(tmp_path, template)
    with pytest.raises(error):
        tokenizer.encode_chat({**chat({"role": "user", "content": "u"}), **fields})


def test_named_templates_and_a_separate_template_file(tmp_path: Path) -> None:
    directory = model_dir(
        tmp_path,
        [
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "with tools"},
        ],
    )
    tokenizer = ModelTokenizer.load(directory)
    request = chat({"role": "user", "content": "u"})
    assert tokenizer.render_chat(request) == "plain"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tokenizer.render_chat({**request, "tools": tools}) == "with tools"
    (directory / "chat_template.jinja").write_text("from the file")
    assert ModelTokenizer.load(directory).render_chat(request) == "from the file"


def test_special_tokens_reach_the_template_and_chat_is_encoded_without_them(
    tmp_path: Path,
) -> None:
    tokenizer = load(tmp_path, "{{ bos_token }}{{ messages[0]['content'] }}")
    request = chat({"role": "user", "content": "the cache"})
    assert tokenizer.render_chat(request) == "<s>the cache"
    ids = tokenizer.encode_chat(request)
    assert ids == tokenizer.encode("<s>the cache", add_special_tokens=False)
    assert ids[0] == tokenizer.token_id("<s>") and ids.count(ids[0]) == 1
    # add_special_tokens on a chat adds the post-processor's BOS before the template's
    doubled = tokenizer.encode_chat({**request, "add_special_tokens": True})
    assert doubled == [ids[0], *ids]


def test_the_length_bound_uses_the_longest_token(tmp_path: Path) -> None:
    tokenizer = load(tmp_path, STRING_TEMPLATE, model_max_length=4096)
    vocabulary = json.loads((SIM_TOKENIZER / "tokenizer.json").read_text())["model"]["vocab"]
    assert tokenizer.max_chars_per_token == max(len(token) for token in vocabulary)
    assert tokenizer.max_model_len == 4096
    assert load(tmp_path, STRING_TEMPLATE, model_max_length=10**30).max_model_len is None


def test_a_model_is_found_in_a_hugging_face_cache(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--name"
    for revision in ("old", "abc123"):
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        shutil.copy(SIM_TOKENIZER / "tokenizer.json", snapshot / "tokenizer.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    assert find_in_hub_cache(tmp_path / "hub", "org/name") == repo / "snapshots" / "abc123"
    (repo / "refs" / "main").write_text("gone")  # no usable ref: a snapshot with the files
    assert find_in_hub_cache(tmp_path / "hub", "org/name") is not None
    assert find_in_hub_cache(tmp_path / "hub", "org/other") is None
    assert find_in_hub_cache(tmp_path / "hub", "../escape") is None


def test_ids_outside_the_vocabulary_decode_to_nothing(tmp_path: Path) -> None:
    tokenizer = load(tmp_path, STRING_TEMPLATE)
    ids = tokenizer.encode("the cache", add_special_tokens=False)
    assert tokenizer.decode([-1, *ids, 2**33, tokenizer.vocab_size]) == "the cache"
    assert tokenizer.token_str(-1) is None and tokenizer.token_str(2**40) is None
