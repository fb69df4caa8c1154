"""The simulated engine's tokenizer: the shipped Hugging Face files, read with
`tokenization`, and what the engine and the benchmarks rely on them for."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.harness.vllm_model import BENCH_SHAPE, SPECIAL_TOKENS, LlamaShape, build_model_dir
from bench.workloads.chat import WORDS
from simulator.tokenizer import SHIPPED_TOKENIZER, SimTokenizer
from tests.conftest import StartEngine
from tokenization import ChatRenderError, NotRenderable, TokenizerLoadError

TOKENIZER = SimTokenizer.load()


def special(token: str) -> int:
    found = TOKENIZER.model.token_id(token)
    assert found is not None, token
    return found


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_decode_inverts_encode(text: str) -> None:
    assert TOKENIZER.decode(TOKENIZER.encode(text, add_special_tokens=False)) == text


def test_the_shipped_files_are_the_benchmark_models_vocabulary() -> None:
    assert TOKENIZER.vocab_size == BENCH_SHAPE.vocab_size == 8192
    assert [TOKENIZER.token_str(i) for i in range(len(SPECIAL_TOKENS))] == list(SPECIAL_TOKENS)
    config = json.loads((SHIPPED_TOKENIZER / "tokenizer_config.json").read_text())
    assert "chat_template" not in config  # chat_template.jinja is the template
    assert config["model_max_length"] >= BENCH_SHAPE.max_model_len
    assert (
        TOKENIZER.model.files.chat_templates["default"]
        == (SHIPPED_TOKENIZER / "chat_template.jinja").read_text()
    )


def test_a_directory_is_loaded_once() -> None:
    assert SimTokenizer.load(SHIPPED_TOKENIZER) is TOKENIZER


def test_every_benchmark_word_is_one_token_after_a_space() -> None:
    """The benchmarks write prompts of exact lengths from these words."""
    split = [
        word for word in WORDS if len(TOKENIZER.encode(f" {word}", add_special_tokens=False)) != 1
    ]
    assert split == []
    sentence = "".join(f" {word}" for word in WORDS)
    assert len(TOKENIZER.encode(sentence, add_special_tokens=False)) == len(WORDS)


def test_special_tokens() -> None:
    ids = TOKENIZER.encode("def hello(): return 42")
    assert ids[0] == special("<s>")
    assert ids[1:] == TOKENIZER.encode("def hello(): return 42", add_special_tokens=False)
    assert TOKENIZER.token_str(ids[0]) == "<s>"
    assert TOKENIZER.decode(ids) == "<s>def hello(): return 42"
    assert TOKENIZER.decode(ids, skip_special_tokens=True) == "def hello(): return 42"
    assert TOKENIZER.decode([10**9, -1, *ids[1:2]]) == "def"  # outside the vocabulary: nothing
    assert TOKENIZER.token_str(10**9) is None and not TOKENIZER.is_valid(TOKENIZER.vocab_size)


def test_generated_words_read_back_as_themselves() -> None:
    words = TOKENIZER.word_token_ids
    assert special("Ġthe") in words and len(words) > len(WORDS)
    for token in words:
        text = TOKENIZER.decode([token])
        assert text[0] == " " and text[1:].isascii() and text[1:].isalpha(), text
        assert text[1:].islower()
        assert TOKENIZER.encode(text, add_special_tokens=False) == [token]


def test_chat_shape_is_the_templates() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ids = TOKENIZER.encode_chat({"messages": messages}, completions=True)
    text = "<s><|system|>\nbe brief<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n"
    assert ids == TOKENIZER.encode(text, add_special_tokens=False)
    newline = TOKENIZER.encode("\n", add_special_tokens=False)
    assert ids[:2] + ids[-2:] == [special("<s>"), special("<|system|>"),
                                  special("<|assistant|>"), *newline]  # fmt: skip
    assert ids.count(special("<|end|>")) == 2
    without = TOKENIZER.encode_chat(
        {"messages": messages, "add_generation_prompt": False}, completions=False
    )
    assert without == ids[:-2]
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    joined = [{"role": "user", "content": "a\nb"}]  # vLLM joins text parts with newlines
    assert TOKENIZER.encode_chat({"messages": parts}, completions=True) == (
        TOKENIZER.encode_chat({"messages": joined}, completions=True)
    )


def test_chat_with_tools_renders_them_and_the_calls() -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    call = {"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": '{"key": "radix"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    request = {"messages": messages, "tools": [tool]}
    text = TOKENIZER.decode(TOKENIZER.encode_chat(request, completions=True))
    assert text.startswith('<s><|system|>\nTools:\n{"type": "function"')
    assert '<tool_call>{"name": "lookup", "arguments": {"key": "radix"}}</tool_call>' in text
    assert "<|user|>\n<tool_result>found</tool_result><|end|>\n<|assistant|>\n" in text


def test_chat_refuses_what_vllm_refuses() -> None:
    with pytest.raises(ChatRenderError, match="wizard"):
        TOKENIZER.encode_chat({"messages": [{"role": "wizard", "content": "x"}]}, completions=True)
    with pytest.raises(ChatRenderError):
        TOKENIZER.encode_chat({"messages": []}, completions=True)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    with pytest.raises(NotRenderable):
        TOKENIZER.encode_chat(
            {"messages": [{"role": "user", "content": [image]}]}, completions=True
        )


def small_tokenizer(path: Path) -> Path:
    """A tokenizer directory unlike the shipped one: 300 tokens, from a few words."""
    shape = LlamaShape(hidden_size=64, intermediate_size=64, num_layers=1, num_heads=1,
                       vocab_size=300, max_model_len=512)  # fmt: skip
    return build_model_dir(path, shape, ["the cat sat on the mat and the dog ran far"] * 50)


def test_another_directory_brings_its_own_vocabulary(tmp_path: Path) -> None:
    other = SimTokenizer.load(small_tokenizer(tmp_path / "small"))
    assert other is not TOKENIZER and other.vocab_size <= 300
    words = {other.decode([token]) for token in other.word_token_ids}
    assert {" cat", " mat", " dog"} <= words
    assert other.encode(" cat sat", add_special_tokens=False) != TOKENIZER.encode(
        " cat sat", add_special_tokens=False
    )
    with pytest.raises(TokenizerLoadError, match=r"no tokenizer\.json"):
        SimTokenizer.load(tmp_path / "nowhere")


async def test_an_engine_serves_the_tokenizer_its_config_names(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    directory = small_tokenizer(tmp_path / "small")
    other = SimTokenizer.load(directory)
    server = await start_engine(tokenizer=directory)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        tokenized = (await client.post("/tokenize", json={"prompt": "the cat ran"})).json()
        answer = await client.post("/v1/completions", json={"prompt": "the", "max_tokens": 8})
    assert tokenized["tokens"] == other.encode("the cat ran")
    text = answer.json()["choices"][0]["text"]
    assert other.encode(text, add_special_tokens=False) != []
    assert set(text.split()) <= {other.decode([t]).strip() for t in other.word_token_ids}
