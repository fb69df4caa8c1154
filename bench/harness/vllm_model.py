"""A Llama model directory built locally for vLLM: config + a byte-level BPE tokenizer with
a chat template, no weights.

vLLM serves it with ``--load-format dummy`` (random weights), so nothing is fetched from a
hub and the model's size (`LlamaShape`) is whatever makes an engine as slow as a test or a
benchmark needs. The tokenizer is trained with the `tokenizers` library on text generated
from a word list and on the Python standard library's own sources, so every build on one
Python gives the same vocabulary; words the caller needs as single tokens (" the", " of",
…) are checked after training. Only vLLM's venv has `tokenizers`: it is imported lazily,
and the benchmark builds its model by running this module there
(``python -m bench.harness.vllm_model DIR [--shape JSON]``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.workloads.chat import WORDS

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
ROOT = Path(__file__).resolve().parents[2]
"""The repository (the vLLM venv is found there; the launcher is run from it)."""
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

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

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


def build_model_dir(
    path: Path,
    shape: LlamaShape,
    corpus: Iterable[str],
    *,
    single_token_words: Sequence[str] = (),
) -> Path:
    """Write config.json, the tokenizer and its chat template into `path` (created);
    returns `path`. The tokenizer has at most `shape.vocab_size` tokens; every word of
    `single_token_words` must come out as one token after a space (" word"), else
    ModelBuildError names the ones that did not."""
    from tokenizers import (  # type: ignore[import-not-found, unused-ignore]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
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
    if size > shape.vocab_size:
        raise ModelBuildError(f"tokenizer has {size} > {shape.vocab_size} tokens")
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
    tokenizer.save(str(path / "tokenizer.json"))
    _write_files(path, shape, tokenizer.token_to_id)
    return path


def _write_files(path: Path, shape: LlamaShape, token_id: Callable[[str], int]) -> None:
    bos, eos, pad = token_id("<s>"), token_id("</s>"), token_id("<unk>")
    _write_json(path / "config.json", shape.config(bos, eos, pad))
    _write_json(path / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos})
    _write_json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "pad_token": "<unk>",
            "add_bos_token": True,
            "model_max_length": shape.max_model_len,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        path / "special_tokens_map.json",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"},
    )


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def build_bench_model(path: Path, shape: LlamaShape = BENCH_SHAPE) -> Path:
    """The routing benchmark's model: every word of the chat workload's `WORDS` is one
    token after a space, so a prompt written from them has an exact length."""
    return build_model_dir(path, shape, training_corpus(WORDS), single_token_words=WORDS)


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


async def build_model(model_dir: Path, shape: LlamaShape, *, python: Path) -> Path:
    """The benchmark's model directory (`build_bench_model`), built by the vLLM venv's
    interpreter `python` (the only one with `tokenizers`) from kvgate's; returns
    `model_dir`."""
    command = [str(python), "-m", "bench.harness.vllm_model", str(model_dir),
               "--shape", json.dumps(shape.as_dict())]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    output, _ = await proc.communicate()
    if proc.returncode != 0:
        text = output.decode(errors="replace")[-3000:]
        raise ModelBuildError(f"building the model in {model_dir} failed:\n{text}")
    return model_dir


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=build_bench_model.__doc__)
    parser.add_argument("path", type=Path, help="the model directory to write")
    parser.add_argument("--shape", type=json.loads, default={},
                        help="LlamaShape fields as JSON (default: BENCH_SHAPE)")  # fmt: skip
    args = parser.parse_args(argv)
    build_bench_model(args.path, dataclasses.replace(BENCH_SHAPE, **args.shape))


if __name__ == "__main__":
    main()
