"""The upstream exchange: the keep-alive pool to the engines, the proxy that relays their
answers, token usage, the metrics scraper, the model catalog and the tokenizer clients
(in-process and the engines' /tokenize)."""
