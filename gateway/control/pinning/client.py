"""Calls to an engine's pin API (SGLang's patched `/hicache/pin_blocks` and
`/hicache/unpin_blocks`, WIRE.md) and the learning of its KV cache size."""

from __future__ import annotations

import re
from collections.abc import Sequence

import httpx

from indexer import EngineHash

PIN_PATH = "/hicache/pin_blocks"
UNPIN_PATH = "/hicache/unpin_blocks"

# vLLM's (and the simulator's) cache config line, e.g.
# vllm:cache_config_info{block_size="16",...,num_gpu_blocks="2048"} 1.0
_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class PinCallError(Exception):
    """The engine did not carry out a pin or unpin call."""


class NoPinSupport(PinCallError):
    """The engine has no pin endpoint (404/405): upstream SGLang, vLLM."""


def wire_hash(engine_hash: EngineHash) -> int | str:
    """As the engine published it: ints stay ints, raw digests travel as hex."""
    return engine_hash.hex() if isinstance(engine_hash, bytes) else engine_hash


class PinClient:
    def __init__(self, client: httpx.AsyncClient, *, timeout_s: float = 5.0) -> None:
        self._client = client
        self._timeout_s = timeout_s

    async def pin(self, url: str, hashes: Sequence[EngineHash]) -> int:
        """Pin (counted) on the engine at `url`; returns the engine's `pinned_count`."""
        return await self._call(url, PIN_PATH, hashes, "pinned_count")

    async def unpin(self, url: str, hashes: Sequence[EngineHash]) -> int:
        return await self._call(url, UNPIN_PATH, hashes, "unpinned_count")

    async def _call(self, url: str, path: str, hashes: Sequence[EngineHash], key: str) -> int:
        body = {"block_hashes": [wire_hash(h) for h in hashes]}
        try:
            response = await self._client.post(f"{url}{path}", json=body, timeout=self._timeout_s)
        except httpx.HTTPError as exc:
            raise PinCallError(f"{path} on {url} failed: {exc!r}") from None
        if response.status_code in (404, 405):
            raise NoPinSupport(f"{url} has no {path} (HTTP {response.status_code})")
        if response.status_code != 200:
            raise PinCallError(f"{path} on {url} answered HTTP {response.status_code}")
        try:
            count = response.json()[key]
        except (ValueError, KeyError, TypeError):
            raise PinCallError(f"{path} on {url} answered without {key!r}") from None
        if not isinstance(count, int):
            raise PinCallError(f"{path} on {url} answered {key}={count!r}")
        return count

    async def capacity_blocks(self, url: str) -> int | None:
        """The engine's GPU KV cache in engine blocks: vLLM-style `cache_config_info` on
        /metrics, else SGLang's /get_server_info (`max_total_num_tokens` / `page_size`).
        None when neither tells."""
        try:
            response = await self._client.get(f"{url}/metrics", timeout=self._timeout_s)
            if response.status_code == 200:
                found = _CACHE_INFO.search(response.text)
                if found is not None:
                    labels = dict(_LABEL.findall(found.group(1)))
                    blocks = labels.get("num_gpu_blocks", "")
                    if blocks.isdigit() and int(blocks) > 0:
                        return int(blocks)
            response = await self._client.get(f"{url}/get_server_info", timeout=self._timeout_s)
            if response.status_code == 200:
                info = response.json()
                tokens = info.get("max_total_num_tokens")
                page = info.get("page_size") or 1
                if isinstance(tokens, int) and isinstance(page, int) and tokens > 0 and page > 0:
                    return tokens // page
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return None
