"""vLLM-like chained block hashes for the simulated engine.

    digest_0 = sha256(root ‖ tokens of block 0)
    digest_i = sha256(digest_{i-1} ‖ tokens of block i)

where `root` = sha256("kvgate-sim-root" ‖ seed) stands in for vLLM's NONE_HASH and tokens
are little-endian uint32. Like vLLM, the int form published in events is the low 64 bits of
the digest (its last 8 bytes, big-endian); the bytes form is the whole 32-byte digest. The
seed is stable by default so a restarted engine (disk tier) computes the same hashes.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from simulator import cbor

_MASK64 = (1 << 64) - 1


def int_hash(digest: bytes) -> int:
    """The unsigned 64-bit id of a block: the low 64 bits of its digest."""
    return int.from_bytes(digest[-8:], "big")


def to_signed64(value: int) -> int:
    """SGLang publishes block ids as signed int64."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def to_unsigned64(value: int) -> int:
    return value & _MASK64


class BlockHasher:
    """Computes the chained digests of the full blocks of a token sequence (the simulator's
    own scheme, `--block-hash sim`)."""

    __slots__ = ("block_size", "root")

    def __init__(self, block_size: int, seed: int = 0) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.root = hashlib.sha256(b"kvgate-sim-root" + str(seed).encode()).digest()

    def chain(
        self, token_ids: Sequence[int], *, parent: bytes | None = None, start_block: int = 0
    ) -> list[bytes]:
        """Digests of full blocks from `start_block` on; `parent` is the digest before it."""
        size = self.block_size
        previous = self.root if parent is None else parent
        digests: list[bytes] = []
        for index in range(start_block, len(token_ids) // size):
            previous = self.digest(previous, token_ids[index * size : (index + 1) * size])
            digests.append(previous)
        return digests

    def digest(self, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        """The digest of one block given its parent's digest (None = the root)."""
        previous = self.root if parent is None else parent
        return hashlib.sha256(previous + array("I", tokens).tobytes()).digest()


class VllmBlockHasher(BlockHasher):
    """vLLM v1's block hash with `--prefix-caching-hash-algo sha256_cbor`:

        digest_i = sha256(cbor((digest_{i-1}, tuple(tokens of block i), extra_keys)))

    with `extra_keys` None (no LoRA, no multimodal input, no cache salt) and the first
    parent NONE_HASH = sha256(cbor(PYTHONHASHSEED)), the seed as the text vLLM reads from
    the environment (`--block-hash sha256_cbor --hash-seed N` models PYTHONHASHSEED=N): a
    router that recomputes vLLM's hashes from the prompt follows these events.
    """

    __slots__ = ()

    def __init__(self, block_size: int, seed: int = 0) -> None:
        super().__init__(block_size, seed)
        self.root = _sha256_cbor(str(seed))

    def digest(self, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        previous = self.root if parent is None else parent
        return _sha256_cbor((previous, tuple(tokens), None))


BLOCK_HASHES = {"sim": BlockHasher, "sha256_cbor": VllmBlockHasher}
"""`--block-hash` schemes by name."""


def _sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor.dumps(value)).digest()
