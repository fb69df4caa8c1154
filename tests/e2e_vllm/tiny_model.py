"""A tiny Llama model directory built locally: config + a BPE tokenizer, no weights.

vLLM serves it with ``--load-format dummy`` (random weights), so nothing is fetched from
a hub. The tokenizer is trained with the `tokenizers` library on text generated here and
on the Python standard library's own sources, so every build on one Python gives the
same vocabulary. Only vLLM's venv has `tokenizers`; it is imported lazily.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

MODEL_NAME = "tiny"
VOCAB_SIZE = 3000
MAX_MODEL_LEN = 2048
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

LLAMA_CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,  # vLLM's CPU attention supports 32, 64, 80, ... (16 fails at run time)
    "hidden_act": "silu",
    "max_position_embeddings": MAX_MODEL_LEN,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

_WORDS = " ".join(
    (
        "the a prefix cache block token hash router gateway engine request prompt system",
        "assistant user question answer radix tree evict store replay index pod model",
        "helpful tiny llama latency throughput memory schedule batch decode prefill event",
    )
).split()


def _corpus() -> Iterator[str]:
    """Deterministic training text: generated sentences, then stdlib sources."""
    for i in range(4000):
        words = [_WORDS[(i * 7 + j * 13) % len(_WORDS)] for j in range(12)]
        yield " ".join(words) + f". Number {i}, value {i * 37 % 1000}!"
    stdlib = Path(os.__file__).parent
    for name in ("json", "asyncio", "email", "http", "logging", "unittest"):
        for source in sorted((stdlib / name).glob("*.py")):
            yield source.read_text(encoding="utf-8", errors="replace")


def build_model_dir(path: Path) -> Path:
    """Write config.json and the tokenizer files into `path` (created); returns `path`."""
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
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer.save(str(path / "tokenizer.json"))
    if tokenizer.get_vocab_size() > VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} > {VOCAB_SIZE} tokens")

    config = dict(LLAMA_CONFIG)
    config["bos_token_id"] = bos
    config["eos_token_id"] = tokenizer.token_to_id("</s>")
    config["pad_token_id"] = tokenizer.token_to_id("<unk>")
    _write_json(path / "config.json", config)
    _write_json(
        path / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
    )
    _write_json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "pad_token": "<unk>",
            "add_bos_token": True,
            "model_max_length": MAX_MODEL_LEN,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        path / "special_tokens_map.json",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"},
    )
    return path


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
