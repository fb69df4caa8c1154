"""The compiled primitives (indexer/_native.c) under hostile and odd inputs.

Engines are not trusted: whatever Python values reach the extension, it must answer as
the pure-Python path does (a dict, the xxhash package) or raise a clean exception, never
crash, leak or corrupt the map. Scenarios that crashed the interpreter run in a child
process, so that a regression fails one test instead of killing the run.
"""

from __future__ import annotations

import copy
import gc
import math
import pickle
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from indexer import PrefixHasher
from indexer.native import load_native
from tests.indexer.native_build import CHILD_PRELUDE, requested_build

NATIVE = load_native(pure=False)
pytestmark = pytest.mark.skipif(NATIVE is None, reason="indexer._native is not built")

if NATIVE is not None:
    from indexer._native import U64Map, match_walk, spread_ends
else:  # pragma: no cover - only where the extension is not built (every test skips)
    U64Map = match_walk = spread_ends = None


class Collider:
    """A key whose hash is chosen (collisions on purpose) and equal only to its twins."""

    def __init__(self, hash_: int, ident: int) -> None:
        self.hash_ = hash_
        self.ident = ident

    def __hash__(self) -> int:
        return self.hash_

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Collider) and (self.hash_, self.ident) == (
            other.hash_,
            other.ident,
        )

    def __repr__(self) -> str:
        return f"Collider({self.hash_}, {self.ident})"


# Keys of every kind the map stores differently: unboxed u64s (0 and 2**64 - 1 the edges),
# object keys (negative, past 64 bits, bytes, tuples, None), and keys a dict takes for a
# u64 key although they are other objects (True == 1, 1.0 == 1).
KEYS = st.one_of(
    st.sampled_from([0, 1, 2, 2**64 - 1, 2**63, -1, -(2**63), 2**64, 2**64 + 8]),
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.binary(max_size=3),
    st.tuples(st.integers(min_value=-2, max_value=2)),
    st.none(),
    st.booleans(),
    st.sampled_from([0.0, 1.0, 2.5, -0.0]),
    st.builds(Collider, st.integers(min_value=-3, max_value=3), st.integers(0, 2)),
)
VALUES = st.one_of(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.sampled_from([0, 2**64 - 1, 2**64, -1, 2**100]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.binary(max_size=3),
    st.tuples(st.integers(min_value=0, max_value=3)),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
)


def _same(ours: object, theirs: object) -> bool:
    """Equal and of the same type: 5 is not True, and 1.0 is not 1."""
    return type(ours) is type(theirs) and ours == theirs


class MapAgainstDict(RuleBasedStateMachine):
    """U64Map against a plain dict under random operations: same answers, same items in
    the same order (and the same key objects), same errors."""

    keys = Bundle("keys")

    def __init__(self) -> None:
        super().__init__()
        self.map: Any = U64Map()
        self.model: dict[Any, Any] = {}

    @initialize(target=keys, key=KEYS)
    def first_key(self, key: Any) -> Any:
        return key

    @rule(target=keys, key=KEYS)
    def new_key(self, key: Any) -> Any:
        return key

    @rule(key=keys, value=VALUES)
    def set(self, key: Any, value: Any) -> None:
        self.map[key] = value
        self.model[key] = value

    @rule(key=keys)
    def get(self, key: Any) -> None:
        assert _same(self.map.get(key), self.model.get(key))
        assert _same(self.map.get(key, "absent"), self.model.get(key, "absent"))
        assert (key in self.map) is (key in self.model)
        if key in self.model:
            assert _same(self.map[key], self.model[key])
        else:
            with pytest.raises(KeyError) as raised:
                self.map[key]
            assert raised.value.args == (key,)

    @rule(key=keys, with_default=st.booleans())
    def pop(self, key: Any, with_default: bool) -> None:
        if with_default:
            assert _same(self.map.pop(key, "absent"), self.model.pop(key, "absent"))
        elif key in self.model:
            assert _same(self.map.pop(key), self.model.pop(key))
        else:
            with pytest.raises(KeyError):
                self.map.pop(key)

    @rule(key=keys)
    def delete(self, key: Any) -> None:
        if key in self.model:
            del self.map[key]
            del self.model[key]
        else:
            with pytest.raises(KeyError):
                del self.map[key]

    @rule(batch=st.dictionaries(KEYS, VALUES, max_size=8))
    def update(self, batch: dict[Any, Any]) -> None:
        for key, value in batch.items():
            self.map[key] = value
        self.model.update(batch)

    @rule(start=st.integers(min_value=0, max_value=2**64 - 200), count=st.sampled_from([70, 150]))
    def grow_and_shrink(self, start: int, count: int) -> None:
        """Enough items to grow the table and rebuild it over deleted slots."""
        span = range(start, start + count)
        for key in span:
            self.map[key] = key
            self.model[key] = key
        for key in span[::2]:
            del self.map[key]
            del self.model[key]

    @rule()
    def clear(self) -> None:
        self.map.clear()
        self.model.clear()

    @rule()
    def empty_one_by_one(self) -> None:
        """An emptied map gives its memory back (past 64 items): it must stay usable."""
        for key in list(self.model):
            del self.map[key]
        self.model.clear()

    @precondition(lambda self: len(self.model) > 0)
    @rule(key=KEYS, kind=st.sampled_from(["keys", "values", "items"]))
    def mutate_while_iterating(self, key: Any, kind: str) -> None:
        ours = iter(getattr(self.map, kind)())
        theirs = iter(getattr(self.model, kind)())
        assert _same(next(ours), next(theirs)) or kind == "items"
        if key in self.model:  # a size change either way: both must refuse to go on
            del self.map[key]
            del self.model[key]
        else:
            self.map[key] = 0
            self.model[key] = 0
        with pytest.raises(RuntimeError):
            next(theirs)
        with pytest.raises(RuntimeError, match="changed size during iteration"):
            next(ours)

    @invariant()
    def same_items_in_the_same_order(self) -> None:
        assert len(self.map) == len(self.model)
        ours, theirs = list(self.map.items()), list(self.model.items())
        assert len(ours) == len(theirs)
        for (key, value), (model_key, model_value) in zip(ours, theirs, strict=True):
            assert _same(key, model_key)
            assert _same(value, model_value)


MapAgainstDict.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMapAgainstDict = MapAgainstDict.TestCase


# -- hashing hostile tokens ------------------------------------------------------------


class Index:
    """An object array('I') takes as an int through __index__ (or refuses, if it raises)."""

    def __init__(self, value: int | None) -> None:
        self.value = value

    def __index__(self) -> int:
        if self.value is None:
            raise TypeError("no index")
        return self.value


TOKENS = st.one_of(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.sampled_from([0, 2**32 - 1, 2**32, -1, 2**64, 2**64 - 1, -(2**63), 2**100]),
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=2),
    st.binary(max_size=2),
    st.none(),
    st.builds(Index, st.one_of(st.none(), st.integers(min_value=-2, max_value=2**33))),
)
CLEAN_ERRORS = (ValueError, TypeError, OverflowError)


def _outcome(hasher: PrefixHasher, parent: Any, tokens: Any, size: Any) -> Any:
    try:
        return hasher.chain(parent, tokens, size)
    except CLEAN_ERRORS as exc:
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.one_of(TOKENS, st.integers(0, 5)), max_size=40),
    container=st.sampled_from([list, tuple]),
    size=st.one_of(
        st.integers(min_value=1, max_value=9),
        st.sampled_from([0, -1, 2**63, 2**70, True, 2.0, None]),
    ),
    parent=st.one_of(
        st.integers(min_value=0, max_value=2**64 - 1),
        st.sampled_from([-1, 2**64, 2**70, True, 1.5, None, b"\x00"]),
    ),
)
def test_hostile_tokens_get_the_pure_paths_answer_or_error(
    tokens: list[Any], container: type[Any], size: Any, parent: Any
) -> None:
    """Either both paths hash alike, or both raise the same clean exception."""
    sequence = container(tokens)
    compiled = _outcome(PrefixHasher(4, pure_python=False), parent, sequence, size)
    pure = _outcome(PrefixHasher(4, pure_python=True), parent, sequence, size)
    assert compiled == pure


@pytest.mark.parametrize("tokens", [b"\x01\x00\x00\x00\x02\x00\x00\x00", bytearray(8)])
def test_bytes_are_no_token_ids_on_either_path(tokens: bytes) -> None:
    """array('I', bytes) reads raw words: the pure path used to hash those, the compiled
    one each byte as a token, so the two disagreed."""
    for pure_python in (False, True):
        with pytest.raises(ValueError, match="token ids"):
            PrefixHasher(2, pure_python=pure_python).prefix_hashes(tokens)  # type: ignore[arg-type]


def test_a_parent_out_of_64_bits_is_refused_on_both_paths() -> None:
    """xxhash takes a seed modulo 2**64: the pure path hashed -1 as 2**64 - 1."""
    for pure_python in (False, True):
        hasher = PrefixHasher(2, pure_python=pure_python)
        for parent in (-1, 2**64):
            with pytest.raises(ValueError, match="parent hash"):
                hasher.chain(parent, [1, 2])


def test_huge_and_bad_token_lists_raise_cleanly() -> None:
    big = list(range(200_000))
    for pure_python in (False, True):
        hasher = PrefixHasher(16, pure_python=pure_python)
        assert len(hasher.prefix_hashes(big)) == 200_000 // 16
        for bad in (-1, 2**32, 2**64, "x", None, 1.5):
            tokens = [*big[:-1], bad]
            with pytest.raises(ValueError, match="token ids"):
                hasher.prefix_hashes(tokens)
        assert hasher.chain(0, big, 2**70) == []
        with pytest.raises(TypeError):
            hasher.chain(0, (t for t in big), 16)  # type: ignore[arg-type]


def test_an_index_that_raises_something_else_goes_through() -> None:
    class Broken:
        def __index__(self) -> int:
            raise ZeroDivisionError("broken token")

    for pure_python in (False, True):
        with pytest.raises(ZeroDivisionError):
            PrefixHasher(2, pure_python=pure_python).prefix_hashes([1, Broken()])  # type: ignore[list-item]


# -- crashes: each in a child process -------------------------------------------------


def _run(script: str) -> str:
    """Runs `script` in a fresh interpreter, on the same build of the extension as this
    one; fails on a crash (or any error) with its output, so a segfault is one failing
    test rather than the end of the run."""
    prelude = CHILD_PRELUDE if requested_build() is not None else ""
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_children_run_the_build_this_process_tests() -> None:
    """Under scripts/sanitize_native.sh that is the sanitized build, not the installed one."""
    from indexer import _native

    child = _run("from indexer import _native; print(_native.__file__)").strip()
    assert Path(child).resolve() == Path(_native.__file__).resolve()


def test_a_finalizer_of_a_replaced_value_may_clear_the_map() -> None:
    """The old value was released before the new one was written: its __del__ clearing
    the map made set_value write into freed (NULL) columns."""
    out = _run(
        """
        from indexer._native import U64Map
        m = U64Map()
        class Evil:
            def __del__(self):
                m.clear()
        for i in range(100):
            m[i] = i
        m[5] = Evil()
        m[5] = 7
        print(len(m), m.get(5))
        """
    )
    assert out.split() == ["0", "None"]


def test_an_eq_that_changes_the_map_makes_the_lookup_start_again() -> None:
    """A stored key's __eq__ clearing the map left the lookup with a stale position that
    delete_at then used (NULL index). A dict starts its lookup again: so must the map."""
    out = _run(
        """
        from indexer._native import U64Map
        m = U64Map()
        class K:
            def __hash__(self):
                return 7
            def __eq__(self, other):
                m.clear()
                return True
        for i in range(200):
            m[i] = i
        m[K()] = 1
        try:
            del m[K()]
        except KeyError:
            print("KeyError", len(m))
        """
    )
    assert out.split() == ["KeyError", "0"]


def test_growing_the_map_runs_no_hash_of_a_key() -> None:
    """The index was rebuilt by hashing object keys again: a __hash__ clearing the map
    mid-rebuild crashed it, one raising left items duplicated. The hash taken on insertion
    is kept (as a dict keeps it)."""
    out = _run(
        """
        from indexer._native import U64Map
        m = U64Map()
        calls = 0
        class K:
            def __hash__(self):
                global calls
                calls += 1
                if calls > 1:
                    m.clear()
                    raise RuntimeError("hashed again")
                return 12345
        k = K()
        m[k] = "k"
        for i in range(5):
            m[i] = i
        del m[0], m[1]
        for i in range(100, 300):
            m[i] = i
        print(calls, len(m), len(list(m.items())), [v for key, v in m.items() if key is k])
        """
    )
    assert out.split() == ["1", "204", "204", "['k']"]


def test_an_index_that_empties_the_token_list_is_refused() -> None:
    """chain read the tokens through a borrowed pointer into the list; a token's __index__
    clearing the list left it reading freed memory."""
    out = _run(
        """
        from indexer._native import chain
        tokens = list(range(100_000))
        class Shrink:
            def __index__(self):
                tokens.clear()
                return 1
        tokens[0] = Shrink()
        try:
            chain(0, tokens, 16)
        except ValueError as exc:
            print("ValueError")
        """
    )
    assert out.split() == ["ValueError"]


def test_spread_ends_survives_names_and_ends_changing_under_it() -> None:
    """A name's __hash__ emptying `names` and `ends` left spread_ends indexing a freed list
    through borrowed references."""
    out = _run(
        """
        from indexer._native import spread_ends
        ends, names = [], []
        class Name(str):
            def __hash__(self):
                ends.clear()
                names.clear()
                return 1
        names[:] = [Name("a"), "b", "c", "d"]
        ends[:] = [(int("1" * 40), 0b1111)]
        try:
            spread_ends({}, names, ends)
        except RuntimeError:
            print("RuntimeError")
        """
    )
    assert out.split() == ["RuntimeError"]


def test_held_from_ends_survives_its_inputs_changing_under_it() -> None:
    """A name's __hash__ emptying the bits, the names and the ends: the function reads
    snapshots of `names` and `ends`, and holds each bit it found while reading it."""
    out = _run(
        """
        from indexer._native import held_from_ends
        bits, ends, names = {}, [], []
        class Name(str):
            def __hash__(self):
                bits.clear()
                ends.clear()
                names.clear()
                return hash(str(self))
        names[:] = ["a", Name("b"), "c"]
        bits.update({"a": 1, "b": 2, "c": 4})
        ends[:] = [(3, 0b1), (5, 0b110)]
        print(held_from_ends(bits, ends, names, 2.0))
        """
    )
    assert out.split() == ["[6.0,", "0.0,", "0.0]"]


def test_deeply_nested_maps_are_freed_without_overflowing_the_stack() -> None:
    out = _run(
        """
        from indexer._native import U64Map
        m = U64Map()
        for _ in range(300_000):
            outer = U64Map()
            outer[0] = m
            m = outer
        del m, outer
        print("freed")
        """
    )
    assert out.split() == ["freed"]


# -- the rest in process ---------------------------------------------------------------


def test_keys_a_dict_takes_for_ints_are_found_as_those_ints() -> None:
    """True == 1 and 1.0 == 1 with the same hash: a dict holds one item for them, keeping
    the key first inserted. The map stored 1 unboxed and True as an object: two items."""
    m: Any = U64Map()
    d: dict[Any, Any] = {}
    for key, value in ((1, "int"), (True, "bool"), (1.0, "float"), (2.0, "two"), (2, "2")):
        m[key] = value
        d[key] = value
    assert list(m.items()) == list(d.items())
    assert [type(k) for k in m] == [type(k) for k in d] == [int, float]
    assert m.get(True) == m[1.0] == "float"
    assert 2 in m
    del m[True]
    assert 1 not in m
    assert list(m.items()) == [(2.0, "2")]
    m.clear()
    m[2**64 - 1] = 5  # a u64 key whose hash differs from the value (past the modulus)
    assert m.get(float(2**64 - 1)) is None  # not equal: float(2**64 - 1) == 2**64
    assert m.get(2**64 - 1) == 5


def test_key_errors_carry_the_key_as_a_dicts_do() -> None:
    m: Any = U64Map()
    stamps = m.stamps()
    for key in ((1, 2), (), 5, b"x"):
        for lookup in (m.__getitem__, m.__delitem__, m.pop, stamps.__getitem__):
            with pytest.raises(KeyError) as raised:
                lookup(key)
            assert raised.value.args == (key,)


def test_cycles_through_iterators_and_stamp_views_are_collected() -> None:
    class Canary:
        pass

    def build() -> weakref.ref[Canary]:
        m: Any = U64Map()
        canary = Canary()
        m[1] = canary
        m[2] = iter(m)
        m[3] = m.stamps()
        m[4] = m.items()
        return weakref.ref(canary)

    ref = build()
    gc.collect()
    assert ref() is None


def test_an_exhausted_iterator_stays_exhausted() -> None:
    m: Any = U64Map()
    m[1] = 1
    it = iter(m)
    assert list(it) == [1]
    m[2] = 2
    assert next(it, "done") == "done"


def test_the_walk_reads_the_map_after_the_callers_code_ran() -> None:
    """`now`'s __float__ ran after the map was found to hold only u64 values: one that
    stored an object value made the walk read a pointer as a holder mask."""
    m: Any = U64Map()
    for key in range(10):
        m[key] = 1

    class Now:
        def __float__(self) -> float:
            m[3] = "not a mask"
            return 1.0

    assert match_walk(m, list(range(10)), 1, Now()) is None


def test_the_walk_stamps_what_it_matched() -> None:
    m: Any = U64Map()
    stamps = m.stamps()
    for key in range(600):  # past the walk's stack buffer
        m[key] = 0b11
    m[300] = 0b01
    ends = match_walk(m, [*range(600), 10**6], 0b11, 5.0)
    assert ends == [(300, 0b10), (600, 0b01)]
    assert all(stamps[key] == 5.0 for key in range(600))
    assert match_walk(m, [-1, 0], 0b11, 6.0) == [(0, 0b11)]  # no u64: in no store
    assert stamps[0] == 5.0


def test_oldest_takes_any_int_and_nan_stamps() -> None:
    """heapq.nsmallest (the pure path) takes a count past 64 bits; a NaN stamp made the
    qsort comparator inconsistent (undefined behaviour)."""
    m: Any = U64Map()
    stamps = m.stamps()
    for key in range(2_000):
        m[key] = 1
        stamps[key] = math.nan if key % 3 == 0 else float(key % 7)
    everything = m.oldest(2**70)
    assert sorted(everything) == list(range(2_000))
    assert m.oldest(-(2**70)) == []
    nans = [key for key in range(2_000) if key % 3 == 0]
    assert everything[: len(nans)] == nans[::-1]  # no usable time: the oldest, tail first
    rest = everything[len(nans) :]
    assert [stamps[key] for key in rest] == sorted(stamps[key] for key in rest)


def test_a_map_that_holds_itself_has_a_repr() -> None:
    m: Any = U64Map()
    m[1] = m
    m[2] = "two"
    assert repr(m) == "U64Map({1: U64Map(...), 2: 'two'})"


def test_a_map_is_never_copied_or_pickled_empty() -> None:
    """Without its own reduction, copy.copy of a C type can silently give an empty
    instance: the map refuses instead (nothing in kvgate copies one)."""
    m: Any = U64Map()
    m[1] = 2
    for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError):
            attempt(m)
    with pytest.raises(TypeError):
        copy.copy(m.stamps())


def test_keys_chosen_to_collide_do_not_make_insertion_quadratic() -> None:
    """u64 keys were placed by (key * 0x9E3779B97F4A7C15) >> shift: an engine sending
    hashes k * inverse(that constant) put every one in slot 0 (each insertion then walked
    all the earlier ones). The slots are now keyed by a per-process secret."""
    multiplier = 0x9E3779B97F4A7C15
    inverse = pow(multiplier, -1, 2**64)
    count = 20_000
    colliding = [(inverse * j) % 2**64 for j in range(count)]
    assert all((k * multiplier) % 2**64 >> 40 == 0 for k in colliding)

    def insert(keys: list[int]) -> float:
        m: Any = U64Map()
        start = time.perf_counter()
        for key in keys:
            m[key] = 1
        return time.perf_counter() - start

    plain = min(insert(list(range(count))) for _ in range(3))
    chosen = min(insert(colliding) for _ in range(3))
    # Quadratic, this took ~250x the sequential keys' time; a ratio, not a deadline, so a
    # busy machine does not fail it.
    assert chosen < 20 * plain + 0.01
