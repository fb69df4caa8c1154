"""A rendered chat encoded piece by piece between its special tokens, each piece cached,
gives exactly the ids of encoding it at once; tokenizers where that does not hold are
encoded at once."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from tokenization.segments import SegmentEncoder

SIM_TOKENIZER = Path(__file__).resolve().parents[2] / "simulator" / "tokenizer"
TOKENIZER = Tokenizer.from_file(str(SIM_TOKENIZER / "tokenizer.json"))
ENCODER = SegmentEncoder(TOKENIZER)
SPECIALS = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
PIECES = st.one_of(
    st.sampled_from(SPECIALS),
    st.text(alphabet=st.sampled_from(list("ab c\n\té日🙂<>|s/")), max_size=12),
    st.sampled_from([" the cache", "\n\n", "  ", "<|", "|>", "<s", "s>"]),
)


def whole(text: str) -> list[int]:
    ids: list[int] = TOKENIZER.encode(text, add_special_tokens=False).ids
    return ids


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=12))
def test_pieces_encode_as_the_whole(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert ENCODER.enabled
    assert ENCODER.encode(text) == whole(text)
    assert ENCODER.encode(text) == whole(text)  # from the cache this time


def test_a_first_piece_treated_specially_disables_it() -> None:
    vocab = {"<unk>": 0, "▁a": 1, "a": 2, "▁b": 3, "b": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.add_special_tokens([AddedToken("<s>", special=True)])
    assert not SegmentEncoder(tokenizer).enabled
    stripping = Tokenizer.from_file(str(SIM_TOKENIZER / "tokenizer.json"))
    stripping.add_special_tokens([AddedToken("<x>", special=True, lstrip=True)])
    assert not SegmentEncoder(stripping).enabled
    assert (
        SegmentEncoder(stripping).encode("a <x> b")
        == stripping.encode("a <x> b", add_special_tokens=False).ids
    )
