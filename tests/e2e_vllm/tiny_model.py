"""The e2e tests' tiny Llama: hidden 256, 2 layers, 4 heads of 64 (vLLM's CPU attention
rejects head size 16), vocab 3000, built by `bench.harness.vllm_model` (config + a BPE
tokenizer, no weights: vLLM serves it with ``--load-format dummy``). Its chat template is
the simulated engine's (`simulator/tokenizer/chat_template.jinja`), so both render a
conversation into the same text.

The tokenizer is trained on sentences of the words below and on the standard library's
sources, so every build on one Python gives the same vocabulary; `tokenizers` is imported
when a model is built.
"""

from __future__ import annotations

from pathlib import Path

from bench.harness import vllm_model

MODEL_NAME = "tiny"
VOCAB_SIZE = 3000
MAX_MODEL_LEN = 2048
SHAPE = vllm_model.LlamaShape(
    hidden_size=256,
    intermediate_size=512,
    num_layers=2,
    num_heads=4,
    vocab_size=VOCAB_SIZE,
    max_model_len=MAX_MODEL_LEN,
)

_WORDS = " ".join(
    (
        "the a prefix cache block token hash router gateway engine request prompt system",
        "assistant user question answer radix tree evict store replay index pod model",
        "helpful tiny llama latency throughput memory schedule batch decode prefill event",
    )
).split()


def build_model_dir(path: Path) -> Path:
    """Write config.json and the tokenizer files into `path` (created); returns `path`."""
    return vllm_model.build_model_dir(path, SHAPE, vllm_model.training_corpus(_WORDS))
