"""Chained prefix hashing over fixed-size blocks of token ids.

h_0 = xxh64(tokens of block 0, seed=seed)
h_i = xxh64(tokens of block i, seed=h_{i-1})

The parent hash is the xxh64 seed of its child, so a block costs one slice and one call
(no concatenation). Tokens are serialized once per call as little-endian uint32 (token
ids never exceed 2**32 in any tokenizer we route for). The seed is configuration, never
random: every replica and every restart must compute the same hashes, or snapshots and
peer replicas would disagree. `HASH_VERSION` names this definition; snapshots record it
(as their format version) and a process refuses hashes of another definition.

With the compiled primitives (indexer/native.py) the same hashes come from C: one call
for the whole prompt instead of a slice and an xxhash call per block.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Sequence

import xxhash

from indexer.native import load_native

DEFAULT_HASH_SEED = 0x6B76_6761_7465  # "kvgate" — any fixed value works; keep it stable.
HASH_VERSION = 2
"""1: xxh64(parent_le64 ‖ tokens, seed); 2: xxh64(tokens, seed=parent) (see above)."""
_MAX_SEED = 2**64 - 1
_TOKEN_BYTES = 4
if array("I").itemsize != _TOKEN_BYTES:  # pragma: no cover - no such platform in practice
    raise ImportError("kvgate's prefix hashing needs a platform with 4-byte unsigned ints")


class PrefixHasher:
    """Computes the gateway's chained block hashes; only full blocks are hashed."""

    __slots__ = ("_native_chain", "block_size", "seed")

    def __init__(
        self, block_size: int, seed: int = DEFAULT_HASH_SEED, *, pure_python: bool | None = None
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 token, got {block_size}")
        if not 0 <= seed <= _MAX_SEED:
            raise ValueError(f"hash seed must be an unsigned 64-bit integer, got {seed}")
        self.block_size = block_size
        self.seed = seed
        native = load_native(pure_python)
        self._native_chain: Callable[[int, Sequence[int], int], list[int]] | None = (
            None if native is None else native.chain
        )

    @property
    def compiled(self) -> bool:
        """Whether the hashes come from the compiled primitives."""
        return self._native_chain is not None

    def prefix_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """Hashes of every full block of a prompt, chained from the seed."""
        native_chain = self._native_chain
        if native_chain is not None:
            return native_chain(self.seed, token_ids, self.block_size)
        return self.chain(self.seed, token_ids)

    def chain(
        self, parent: int, token_ids: Sequence[int], block_size: int | None = None
    ) -> list[int]:
        """Hashes of the full blocks of `token_ids`, the first chained onto `parent`.

        `block_size` defaults to the hasher's own; the indexer passes it explicitly when it
        re-chunks an engine's larger blocks.
        """
        size = self.block_size if block_size is None else block_size
        native_chain = self._native_chain
        if native_chain is not None:
            return native_chain(parent, token_ids, size)
        _check_chain_args(parent, token_ids, size)
        blocks = len(token_ids) // size
        if blocks == 0:
            return []
        raw = _serialize(token_ids, blocks * size)
        step = size * _TOKEN_BYTES
        digest = xxhash.xxh64_intdigest
        out: list[int] = []
        append = out.append
        for offset in range(0, blocks * step, step):
            parent = digest(raw[offset : offset + step], parent)
            append(parent)
        return out


def _check_chain_args(parent: int, token_ids: Sequence[int], size: int) -> None:
    """What the compiled chain refuses (indexer/_native.c), refused here alike: xxhash would
    take a negative or oversized parent modulo 2**64, a size below 1 would divide by zero or
    slice backwards, and array('I', bytes) reads raw machine words instead of token ids."""
    if not isinstance(parent, int):
        raise TypeError(f"parent hash must be an int, not {type(parent).__name__!r}")
    if not 0 <= parent <= _MAX_SEED:
        raise ValueError("parent hash must be an unsigned 64-bit integer")
    if not isinstance(size, int):
        raise TypeError(f"block_size must be an int, not {type(size).__name__!r}")
    if size < 1:
        raise ValueError("block_size must be >= 1 token")
    if isinstance(token_ids, bytes | bytearray):
        raise ValueError("token ids must be integers in [0, 2**32), not bytes")


def _serialize(token_ids: Sequence[int], count: int) -> bytes:
    try:
        packed = array("I", token_ids[:count] if len(token_ids) != count else token_ids)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from exc
    if sys.byteorder == "big":  # pragma: no cover - the hash must not depend on the host
        packed.byteswap()
    return packed.tobytes()
