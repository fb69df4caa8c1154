"""Model directories built locally for vLLM: config + a byte-level BPE tokenizer with a
chat template, no weights; and the simulated engine's tokenizer, trained the same way.

vLLM serves such a model with ``--load-format dummy`` (random weights), so nothing is
fetched from a hub and the model's size (`LlamaShape`) is whatever makes an engine as slow
as a test or a benchmark needs.

A tokenizer is trained with the `tokenizers` library on text generated from a word list and
on the Python standard library's own sources, so every build on one Python gives the same
vocabulary; words the caller needs as single tokens (" the", " of", …) are checked after
training. The simulated engine's tokenizer (`build_simulator_tokenizer`: vocabulary 8192,
every word of the chat workload's `WORDS` one token) is trained once and shipped in
`simulator/tokenizer/`; the routing benchmark's model (`build_bench_model`) copies it, so
real and simulated engines tokenize alike. Every model renders chats with the simulated
model's template (`simulator/tokenizer/chat_template.jinja`). Regenerate the shipped files
with ``python -m bench.harness.vllm_model --simulator-tokenizer``; build the benchmark's
model with ``python -m bench.harness.vllm_model DIR [--shape JSON]``. `tokenizers` is
imported only when a tokenizer is trained.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.workloads.chat import WORDS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
ROOT = Path(__file__).resolve().parents[2]
"""The repository (the vLLM venv is found there; the launcher is run from it)."""
SIMULATOR_TOKENIZER = ROOT / "simulator" / "tokenizer"
"""The simulated engine's tokenizer files (`build_simulator_tokenizer` writes them)."""
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE = (SIMULATOR_TOKENIZER / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
"""The simulated model's chat template, which every model built here renders chats with."""
SIMULATOR_MODEL_MAX_LENGTH = 131_072
"""The simulated tokenizer's `model_max_length`: at least any `--max-model-len` a simulated
engine is given (the engine's own limit is that flag, not this)."""
_STDLIB_PACKAGES = ("json", "asyncio", "email", "http", "logging", "unittest")
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention accepts (0.32; 16 fails at run time)."""


class ModelBuildError(RuntimeError):
    """The model directory could not be built, or its tokenizer came out unlike what was
    asked (too many tokens, a word split)."""


@dataclass(frozen=True, slots=True)
class LlamaShape:
    """A Llama's sizes. The compute per prompt token grows with
    layers × (4·hidden² + 3·hidden·intermediate); the vocabulary costs only at the sampled
    positions, so it weighs on decoding, not on prefill."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    max_model_len: int
    num_kv_heads: int | None = None
    """Grouped-query attention when fewer than `num_heads` (None: as many)."""
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "vocab_size", "max_model_len"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_heads {self.num_heads}")  # fmt: skip
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head size {self.head_dim} (hidden_size / num_heads) is not one "
                             f"vLLM's CPU attention supports: {SUPPORTED_HEAD_DIMS}")  # fmt: skip
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.kv_heads}")  # fmt: skip

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token takes (K and V, every layer; 4-byte floats)."""
        itemsize = 4 if self.dtype == "float32" else 2
        return 2 * self.num_layers * self.kv_heads * self.head_dim * itemsize

    def config(self, bos: int, eos: int, pad: int) -> dict[str, object]:
        """`config.json` of a Hugging Face LlamaForCausalLM of this shape."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_model_len,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "torch_dtype": self.dtype,
            "vocab_size": self.vocab_size,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": pad,
        }


BENCH_SHAPE = LlamaShape(
    hidden_size=512,
    intermediate_size=1536,
    num_layers=8,
    num_heads=8,
    vocab_size=8192,
    max_model_len=8192,
)
"""The routing benchmark's model (`build_bench_model`), sized so that prefill dominates: on
one core of the 2-core AVX2 machine it was chosen on (float32, one thread), a cold prompt
of 512 tokens takes ~0.5 s, 1024 ~1.2 s, 2048 ~3 s, and a decode step ~18–20 ms at batch
1 (~32 ms at batch 4). Hidden 768 doubles the prefill (2048 tokens: 5.5 s)."""


def training_corpus(words: Sequence[str], sentences: int = 4000) -> Iterator[str]:
    """Deterministic training text: `sentences` generated from `words` (each word about
    equally often, mostly after a space), then stdlib sources."""
    for i in range(sentences):
        picked = [words[(i * 7 + j * 13) % len(words)] for j in range(12)]
        yield " ".join(picked) + f". Number {i}, value {i * 37 % 1000}!"
    stdlib = Path(os.__file__).parent
    for name in _STDLIB_PACKAGES:
        for source in sorted((stdlib / name).glob("*.py")):
            yield source.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(
    vocab_size: int, corpus: Iterable[str], *, single_token_words: Sequence[str] = ()
) -> Tokenizer:
    """A byte-level BPE tokenizer of at most `vocab_size` tokens trained on `corpus`:
    `SPECIAL_TOKENS` are its first ids, `<s>` starts an encoding with special tokens, and
    every word of `single_token_words` comes out as one token after a space (" word"),
    else ModelBuildError names the ones that did not."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    size = tokenizer.get_vocab_size()
    if size > vocab_size:
        raise ModelBuildError(f"tokenizer has {size} > {vocab_size} tokens")
    split = [
        word
        for word in single_token_words
        if len(tokenizer.encode(f" {word}", add_special_tokens=False).ids) != 1
    ]
    if split:
        raise ModelBuildError(
            f"{len(split)} words are not single tokens after a space (a larger vocabulary "
            f"or more training text would merge them): {split[:20]}"
        )
    return tokenizer


def build_simulator_tokenizer(path: Path = SIMULATOR_TOKENIZER) -> Path:
    """Write the simulated engine's tokenizer into `path` (created): `tokenizer.json`,
    `tokenizer_config.json` and the chat template; returns `path`. Vocabulary 8192 (the
    benchmark model's), every word of `WORDS` one token after a space."""
    tokenizer = train_tokenizer(
        BENCH_SHAPE.vocab_size, training_corpus(WORDS), single_token_words=WORDS
    )
    _write_tokenizer(path, tokenizer, SIMULATOR_MODEL_MAX_LENGTH)
    return path


def build_model_dir(
    path: Path,
    shape: LlamaShape,
    corpus: Iterable[str],
    *,
    single_token_words: Sequence[str] = (),
) -> Path:
    """Write config.json, a tokenizer trained on `corpus` (`train_tokenizer`, at most
    `shape.vocab_size` tokens) and the chat template into `path` (created); returns
    `path`."""
    tokenizer = train_tokenizer(shape.vocab_size, corpus, single_token_words=single_token_words)
    _write_tokenizer(path, tokenizer, shape.max_model_len)
    _write_model_files(path, shape, _token_ids(path / "tokenizer.json"))
    return path


def build_bench_model(path: Path, shape: LlamaShape = BENCH_SHAPE) -> Path:
    """The routing benchmark's model in `path` (created; returns `path`): a Llama of
    `shape` with the simulated engine's tokenizer, copied, so every word of the chat
    workload's `WORDS` is one token after a space and a prompt written from them has an
    exact length."""
    source = SIMULATOR_TOKENIZER / "tokenizer.json"
    ids = _token_ids(source)
    if len(ids) > shape.vocab_size:
        raise ModelBuildError(
            f"the simulator's tokenizer has {len(ids)} tokens: more than vocab_size "
            f"{shape.vocab_size}"
        )
    path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path / "tokenizer.json")
    _write_tokenizer_config(path, shape.max_model_len)
    _write_model_files(path, shape, ids)
    return path


def _write_tokenizer(path: Path, tokenizer: Tokenizer, model_max_length: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    # Compact: the pretty form is 2.4 times the size (one line per merge pair element).
    tokenizer.save(str(path / "tokenizer.json"), pretty=False)
    _write_tokenizer_config(path, model_max_length)


def _write_tokenizer_config(path: Path, model_max_length: int) -> None:
    """`tokenizer_config.json` and `chat_template.jinja` (the template is that file alone,
    as transformers and `tokenization` read it first)."""
    _write_json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "pad_token": "<unk>",
            "add_bos_token": True,
            # transformers would otherwise "clean up" spaces before punctuation when
            # decoding, and vLLM's output text would differ from the tokenizer's decode.
            "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length,
        },
    )
    (path / CHAT_TEMPLATE_FILE).write_text(CHAT_TEMPLATE, encoding="utf-8")


def _token_ids(tokenizer_json: Path) -> dict[str, int]:
    """Every token's id, read from `tokenizer.json` (no `tokenizers` needed)."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    ids: dict[str, int] = dict(data["model"]["vocab"])
    ids.update({token["content"]: token["id"] for token in data["added_tokens"]})
    return ids


def _write_model_files(path: Path, shape: LlamaShape, ids: dict[str, int]) -> None:
    bos, eos, pad = ids["<s>"], ids["</s>"], ids["<unk>"]
    _write_json(path / "config.json", shape.config(bos, eos, pad))
    _write_json(path / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos})
    _write_json(
        path / "special_tokens_map.json",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"},
    )


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


class VllmNotInstalled(RuntimeError):
    """No vLLM venv (`KVGATE_VLLM_INSTALL_ONLY=1 scripts/e2e-vllm.sh` builds it)."""


def vllm_python(root: Path = ROOT) -> Path:
    """The interpreter of the vLLM venv: `$KVGATE_VLLM_VENV` (relative to the repository,
    as `scripts/e2e-vllm.sh` reads it) or `.venv-vllm/`."""
    venv = root / os.environ.get("KVGATE_VLLM_VENV", ".venv-vllm")
    python = venv / "bin" / "python"
    if not python.exists():
        raise VllmNotInstalled(
            f"no vLLM venv at {venv} (build it with KVGATE_VLLM_INSTALL_ONLY=1 scripts/e2e-vllm.sh)"
        )
    return python


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Build the routing benchmark's model directory (a Llama of BENCH_SHAPE "
        "with the simulated engine's tokenizer), or regenerate the simulated engine's "
        "tokenizer files."
    )
    parser.add_argument("path", type=Path, nargs="?", help="the model directory to write")
    parser.add_argument("--shape", type=json.loads, default={},
                        help="LlamaShape fields as JSON (default: BENCH_SHAPE)")  # fmt: skip
    parser.add_argument(
        "--simulator-tokenizer", type=Path, nargs="?", const=SIMULATOR_TOKENIZER, metavar="DIR",
        help=f"train the simulated engine's tokenizer into DIR (default {SIMULATOR_TOKENIZER})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if (args.path is None) == (args.simulator_tokenizer is None):
        parser.error("give either a model directory or --simulator-tokenizer")
    if args.simulator_tokenizer is not None:
        build_simulator_tokenizer(args.simulator_tokenizer)
    else:
        build_bench_model(args.path, dataclasses.replace(BENCH_SHAPE, **args.shape))


if __name__ == "__main__":
    main()
