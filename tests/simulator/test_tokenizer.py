from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.chat_template import ChatTemplate, ChatTemplateError
from simulator.tokenizer import ASSISTANT_ID, BOS_ID, END_ID, SYSTEM_ID, USER_ID, SimTokenizer

TOKENIZER = SimTokenizer()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_decode_inverts_encode(text: str) -> None:
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text


def test_encoding_is_deterministic_and_compact() -> None:
    text = "You are a helpful assistant for the golden capture. What is a radix tree?"
    first = SimTokenizer().encode(text)
    assert first == TOKENIZER.encode(text)
    assert len(first) < len(text) / 2  # common words are single tokens


def test_special_tokens() -> None:
    ids = TOKENIZER.encode("def hello(): return 42", add_special_tokens=True)
    assert ids[0] == BOS_ID
    assert ids[1:] == TOKENIZER.encode("def hello(): return 42")
    assert TOKENIZER.token_str(BOS_ID) == "<s>"
    assert TOKENIZER.decode(ids) == "<s>def hello(): return 42"
    assert TOKENIZER.decode(ids, skip_special_tokens=True) == "def hello(): return 42"
    assert TOKENIZER.decode([10**9]) == ""


def test_chat_template_shape() -> None:
    template = ChatTemplate(TOKENIZER)
    newline = TOKENIZER.encode("\n")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ids = template.render(messages)
    expected = (
        [SYSTEM_ID, *newline, *TOKENIZER.encode("be brief"), END_ID, *newline]
        + [USER_ID, *newline, *TOKENIZER.encode("hi"), END_ID, *newline]
        + [ASSISTANT_ID, *newline]
    )
    assert ids == expected
    without = template.render(messages, add_generation_prompt=False, add_special_tokens=True)
    assert without == [BOS_ID, *expected[:-2]]
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}
    ]
    assert template.render(parts) == template.render([{"role": "user", "content": "hi"}])


def test_chat_template_rejects_unknown_role() -> None:
    template = ChatTemplate(TOKENIZER)
    try:
        template.render([{"role": "wizard", "content": "x"}])
    except ChatTemplateError as exc:
        assert "wizard" in str(exc)
    else:
        raise AssertionError("unknown role accepted")
