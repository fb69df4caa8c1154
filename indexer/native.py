"""Which implementation of the index's primitives a table runs: compiled or pure Python.

`indexer/_native.c` (built by `pip install`, optional: without a C compiler the install
still succeeds) provides the chained block hashing, an unboxed insertion-ordered u64 map
(the blocks' holder masks and last access times, the pods' engine-hash entries), the
match walk, and the routing decision's passes over its candidates (the tokens each holds,
the cost model's multiply-add, the argsort). The pure-Python path keeps plain dicts and
the `xxhash` package; both give identical hashes and answers. `KVGATE_PURE_PYTHON=1`
forces the pure path: the gateway reads it with its settings (`IndexConfig.pure_python`);
a table or hasher built without that choice reads the variable when it is built (tests,
benchmarks).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from indexer._native import U64Map

PURE_PYTHON_ENV = "KVGATE_PURE_PYTHON"
NATIVE_INTERFACE = 4
"""The compiled module's interface this source calls (`_native.INTERFACE`). A build from
an older source (an editable install not rebuilt after a pull) is not used: the pure-Python
path runs instead of a kernel called with arguments it does not take."""

_K = TypeVar("_K")
_V = TypeVar("_V")
_T = TypeVar("_T")


class BlockMap(Protocol[_K, _V]):
    """The mapping operations the index performs on its block and entry maps: a dict on
    the pure path, `_native.U64Map` on the compiled one (same order, same answers)."""

    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __getitem__(self, key: _K, /) -> _V: ...
    def __setitem__(self, key: _K, value: _V, /) -> None: ...
    def __delitem__(self, key: _K, /) -> None: ...
    def __iter__(self) -> Iterator[_K]: ...
    @overload
    def get(self, key: _K, default: None = None, /) -> _V | None: ...
    @overload
    def get(self, key: _K, default: _V, /) -> _V: ...
    @overload
    def get(self, key: _K, default: _T, /) -> _V | _T: ...
    @overload
    def pop(self, key: _K, /) -> _V: ...
    @overload
    def pop(self, key: _K, default: _V, /) -> _V: ...
    @overload
    def pop(self, key: _K, default: _T, /) -> _V | _T: ...
    def items(self) -> Iterable[tuple[_K, _V]]: ...
    def values(self) -> Iterable[_V]: ...
    def clear(self) -> None: ...


class Stamps(Protocol):
    """Last access time per block (a dict, or the compiled map's float column)."""

    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __getitem__(self, key: int, /) -> float: ...
    def __setitem__(self, key: int, value: float, /) -> None: ...


HeldFromEnds = Callable[
    [dict[str, int], list[tuple[int, int]], list[str] | tuple[str, ...], float],
    list[float] | None,
]
"""`MatchedBlocks.held` in C: (candidate bits, the walk's ends, names, tokens per block) ->
per name its matched tokens (None: masks wider than 64 bits)."""
ReleaseRun = Callable[
    [Any, Any, Sequence[Any], int, int, dict[int, list[int]]],
    tuple[int, int, int],
]
"""`Ingest.removed`'s common case in C: (the pod's entries, its base store's masks, the
removed engine hashes, where to start, the pod's bit, the store's tier masks) -> (where
it stopped, entries removed, (pod, block) pairs dropped)."""

StoreRun = Callable[
    [Any, Any, Sequence[Any], list[int], int, int, dict[int, list[int]], float],
    tuple[int, int],
]
"""`Ingest.stored`'s common case in C: (the pod's entries, its base store's masks, the
event's engine hashes, their gateway hashes, where to start, the pod's bit, the store's
tier masks, now) -> (where it stopped, entries added)."""


@dataclass(frozen=True, slots=True)
class Native:
    """The compiled primitives a table uses (see module docstring)."""

    chain: Callable[[int, Sequence[int], int], list[int]]
    """`PrefixHasher.chain` (parent hash, token ids, block size) in C."""
    store_run: StoreRun
    """`Ingest.stored`'s loop over the common case (see `StoreRun`)."""
    release_run: ReleaseRun
    """`Ingest.removed`'s loop over the common case (see `ReleaseRun`)."""
    match_walk: Callable[
        [U64Map[int, int], Sequence[int], int, float], list[tuple[int, int]] | None
    ]
    """The walk of `match_prefix` over a compiled map (None: masks wider than 64 bits)."""
    map_type: type[U64Map[Any, Any]]
    spread_ends: Callable[[dict[str, int], list[str | None], list[tuple[int, int]]], bool]
    """`MatchedBlocks.table`'s loop over the set bits of the walk's ends (False: masks
    wider than 64 bits)."""
    held_from_ends: HeldFromEnds
    """`MatchedBlocks.held`'s loop: the tokens each candidate holds, from the walk's ends."""


def pure_python_forced(environ: Mapping[str, str] | None = None) -> bool:
    """Whether KVGATE_PURE_PYTHON asks for the pure-Python path (1, true, yes or on, as
    the gateway's settings read booleans)."""
    value = (os.environ if environ is None else environ).get(PURE_PYTHON_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def load_native(pure: bool | None = None) -> Native | None:
    """The compiled primitives, or None for the pure-Python path: when `pure` (default:
    KVGATE_PURE_PYTHON) asks for it, or when the extension was not built."""
    if pure is None:
        pure = pure_python_forced()
    if pure:
        return None
    try:
        from indexer import _native
    except ImportError:
        return None
    interface = getattr(_native, "INTERFACE", None)
    if interface != NATIVE_INTERFACE:
        logging.getLogger(__name__).warning(
            "indexer._native was built from another version of its source (interface %s, "
            "expected %s): running pure Python; reinstall kvgate to rebuild it",
            interface, NATIVE_INTERFACE,
        )  # fmt: skip
        return None
    return Native(
        chain=_native.chain,
        store_run=_native.store_run,
        release_run=_native.release_run,
        match_walk=_native.match_walk,
        map_type=_native.U64Map,
        spread_ends=_native.spread_ends,
        held_from_ends=_native.held_from_ends,
    )
