"""Types of the compiled primitives (indexer/_native.c); see indexer/native.py."""

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

_K = TypeVar("_K")
_V = TypeVar("_V")
_T = TypeVar("_T")
_E = TypeVar("_E", bound=tuple[Any, ...])

INTERFACE: int

def xxh64(data: bytes, seed: int, /) -> int: ...
def chain(parent: int, token_ids: Sequence[int], block_size: int, /) -> list[int]: ...
def match_walk(
    held: U64Map[int, int], prefix_hashes: Sequence[int], alive: int, now: float, /
) -> list[tuple[int, int]] | None: ...
def spread_ends(
    table: dict[str, int], names: list[str | None], ends: list[tuple[int, int]], /
) -> bool: ...
def affine_costs(
    bases: list[float],
    units: list[float],
    ends: list[float],
    cached: list[float],
    prompt_tokens: float,
    step_term: float,
    now: float,
    /,
) -> tuple[list[float], list[float]]: ...
def held_from_ends(
    bits: dict[str, int],
    ends: list[tuple[int, int]],
    names: list[str] | tuple[str, ...],
    scale: float,
    /,
) -> list[float] | None: ...
def store_run(
    entries: U64Map[Any, Any],
    held: U64Map[int, int],
    engine_hashes: Sequence[Any],
    gateway_hashes: list[int],
    start: int,
    bit: int,
    tiers: dict[int, list[int]],
    now: float,
    /,
) -> tuple[int, int]: ...
def release_run(
    entries: U64Map[Any, Any],
    held: U64Map[int, int],
    hashes: Sequence[Any],
    start: int,
    bit: int,
    tiers: dict[int, list[int]],
    /,
) -> tuple[int, int, int]: ...
def argsort(values: list[float], /) -> list[int]: ...
def affine_order(
    bases: list[float],
    units: list[float],
    ends: list[float],
    cached: list[float],
    prompt_tokens: float,
    step_term: float,
    now: float,
    tolerance: float,
    waits: list[float],
    delay_weight: float,
    rates: list[float],
    arrival_weight: float,
    prefill_weight: float,
    /,
) -> tuple[list[int], int, int]: ...
def pod_estimate(
    work: Any,
    theta: tuple[float, ...],
    typical_speed: float,
    theta_version: int,
    scraped_at: float | None,
    running: float,
    waiting: float,
    make: type[_E],
    /,
) -> _E: ...

class U64Map(Generic[_K, _V]):
    """An insertion-ordered mapping storing unsigned 64-bit int keys and values unboxed."""

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
    def keys(self) -> Iterator[_K]: ...
    def values(self) -> Iterator[_V]: ...
    def items(self) -> Iterator[tuple[_K, _V]]: ...
    def clear(self) -> None: ...
    def stamps(self) -> StampView: ...
    def oldest(self, count: int, /) -> list[_K]: ...

class StampView:
    """A U64Map's float column (a block's last access), keyed as the map."""

    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __getitem__(self, key: int, /) -> float: ...
    def __setitem__(self, key: int, value: float, /) -> None: ...
