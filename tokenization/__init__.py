"""A model's own tokenizer and chat template, rendered as vLLM renders them.

Pure and synchronous, no I/O after loading: the gateway tokenizes prompts in-process with
it (`gateway.upstream.local_tokenizer.LocalTokenizers`), and the simulated engine serves
`/tokenize` and generation with it, as a vLLM engine does with the model's Hugging Face
files.
"""

from tokenization.errors import (
    ChatRenderError,
    NotRenderable,
    TokenizationError,
    TokenizerLoadError,
)
from tokenization.files import TokenizerFiles, find_in_hub_cache
from tokenization.model import ModelTokenizer, too_long

__all__ = [
    "ChatRenderError",
    "ModelTokenizer",
    "NotRenderable",
    "TokenizationError",
    "TokenizerFiles",
    "TokenizerLoadError",
    "find_in_hub_cache",
    "too_long",
]
