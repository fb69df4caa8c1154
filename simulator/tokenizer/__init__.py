"""The simulated engine's tokenizer (`sim_tokenizer`) and its shipped Hugging Face files:
`tokenizer.json`, `tokenizer_config.json` and `chat_template.jinja`."""

from simulator.tokenizer.sim_tokenizer import SHIPPED_TOKENIZER, SimTokenizer

__all__ = ["SHIPPED_TOKENIZER", "SimTokenizer"]
