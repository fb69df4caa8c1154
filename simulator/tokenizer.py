"""A deterministic, self-contained tokenizer for the simulated engine.

No downloads, no randomness: the vocabulary is built from constants at start-up, so every
engine (and every restart) maps the same text to the same token ids.

Vocabulary, in id order:
  0..6      special tokens (`<unk>`, `<s>`, `</s>`, `<|user|>`, `<|assistant|>`, `<|system|>`,
            `<|end|>`),
  7..262    one token per byte (`<0x00>`..`<0xFF>`), the fallback for anything else,
  263..     whole common words (with and without a leading space), single characters and
            two-letter pieces (with and without a leading space), digits, newline.

Encoding splits text into words (an optional leading space plus letters, a digit, a run of
punctuation, or whitespace); a known word is one token, an unknown word is cut into
two-letter pieces, and whatever is still unknown falls back to its UTF-8 bytes. Decoding
concatenates piece strings, so `decode(encode(text)) == text` for any text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

SPECIAL_TOKENS: tuple[str, ...] = (
    "<unk>",
    "<s>",
    "</s>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end|>",
)
UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
USER_ID = 3
ASSISTANT_ID = 4
SYSTEM_ID = 5
END_ID = 6
_BYTE_BASE = len(SPECIAL_TOKENS)

_COMMON_WORDS_TEXT = """
the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by word but what some we can out other were all there when up use your how said
an each she which do their time if will way about many then them write would like so these her
long make thing see him two has look more day could go come did number sound no most people my
over know water than call first who may down side been now find any new work part take get
place made live where after back little only round man year came show every good me give our
under name very through just form sentence great think say help low line differ turn cause
much mean before move right boy old too same tell does set three want air well also play small
end put home read hand port large spell add even land here must big high such follow act why
ask men change went light kind off need house picture try us again animal point mother world
near build self earth father model cache token prefix block request engine event hash route
assistant user system helpful answer question explain tree radix value key store memory data
"""
_COMMON_WORDS = tuple(_COMMON_WORDS_TEXT.split())

_WORD_RE = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s")
_PIECE_LEN = 2
_WORD_CACHE_LIMIT = 65536


def _build_pieces() -> list[str]:
    pieces: list[str] = []
    seen: set[str] = set()

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)

    for word in _COMMON_WORDS:
        for variant in (word, word.capitalize()):
            add(variant)
            add(" " + variant)
    add("\n")
    add(" ")
    for ch in string.digits + string.punctuation + string.ascii_letters:
        add(ch)
        add(" " + ch)
    letters = string.ascii_lowercase
    for first in letters:
        for second in letters:
            add(first + second)
            add(" " + first + second)
    return pieces


class SimTokenizer:
    """Reversible greedy tokenizer over a fixed vocabulary; see the module docstring."""

    def __init__(self) -> None:
        self._pieces = _build_pieces()
        self._id_of: dict[str, int] = {}
        for index, piece in enumerate(self._pieces):
            self._id_of[piece] = _BYTE_BASE + 256 + index
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self.vocab_size = _BYTE_BASE + 256 + len(self._pieces)
        self.word_token_ids: tuple[int, ...] = tuple(
            self._id_of[" " + word] for word in _COMMON_WORDS
        )

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`, with `<s>` first when `add_special_tokens` is true."""
        ids: list[int] = [BOS_ID] if add_special_tokens else []
        cache = self._word_cache
        for word in _WORD_RE.findall(text):
            cached = cache.get(word)
            if cached is None:
                cached = self._encode_word(word)
                if len(cache) < _WORD_CACHE_LIMIT:
                    cache[word] = cached
            ids.extend(cached)
        return ids

    def _encode_word(self, word: str) -> tuple[int, ...]:
        direct = self._id_of.get(word)
        if direct is not None:
            return (direct,)
        out: list[int] = []
        start = 0
        while start < len(word):
            for length in (_PIECE_LEN + 1, _PIECE_LEN, 1):
                piece = word[start : start + length]
                if len(piece) == length and piece in self._id_of:
                    out.append(self._id_of[piece])
                    start += length
                    break
            else:
                out.extend(_BYTE_BASE + byte for byte in word[start].encode("utf-8"))
                start += 1
        return tuple(out)

    def token_str(self, token_id: int) -> str | None:
        """The printable form of one token (`Ġ` marks a leading space, like GPT-2 vocabularies)."""
        if 0 <= token_id < _BYTE_BASE:
            return SPECIAL_TOKENS[token_id]
        if _BYTE_BASE <= token_id < _BYTE_BASE + 256:
            return f"<0x{token_id - _BYTE_BASE:02X}>"
        index = token_id - _BYTE_BASE - 256
        if 0 <= index < len(self._pieces):
            return self._pieces[index].replace(" ", "Ġ").replace("\n", "Ċ")
        return None

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `token_ids`; ids outside the vocabulary decode to nothing."""
        parts: list[str] = []
        pending = bytearray()
        for token_id in token_ids:
            if _BYTE_BASE <= token_id < _BYTE_BASE + 256:
                pending.append(token_id - _BYTE_BASE)
                continue
            if pending:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if 0 <= token_id < _BYTE_BASE:
                if not skip_special_tokens:
                    parts.append(SPECIAL_TOKENS[token_id])
                continue
            index = token_id - _BYTE_BASE - 256
            if 0 <= index < len(self._pieces):
                parts.append(self._pieces[index])
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def is_valid(self, token_id: int) -> bool:
        return 0 <= token_id < self.vocab_size
