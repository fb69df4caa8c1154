"""Keeping the index bounded: the caps on contexts and on blocks per context (LRU), and
the periodic eviction pass that also expires router-side entries."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter

from indexer.block import PrefixStore
from indexer.config import IndexLimits
from indexer.expected import ExpectedEntries
from indexer.holdings import Holdings
from indexer.pod import IndexedPod
from indexer.types import REAL_TIERS, ModelContext

_EVICT_TO = 0.9  # a store over its cap is trimmed to 90% of it, so trims are rare
_last_access = attrgetter("last_access")


class Evictor:
    """Owns the table's stores' lifetimes: creates them, trims them, drops them."""

    __slots__ = (
        "_expected",
        "_holdings",
        "_limits",
        "_new_store",
        "_next_run",
        "_pods",
        "_stores",
        "evicted_blocks",
        "evicted_contexts",
        "runs",
    )

    def __init__(
        self,
        limits: IndexLimits,
        new_store: Callable[[ModelContext, float], PrefixStore],
        stores: dict[ModelContext, PrefixStore],
        pods: Mapping[str, IndexedPod],
        holdings: Holdings,
        expected: ExpectedEntries,
        now: float,
    ) -> None:
        self._limits = limits
        self._new_store = new_store  # the table's layout: dicts or compiled maps
        self._stores = stores  # the table's stores: this class adds and drops them
        self._pods = pods  # the table's registered pods (their entries are swept here)
        self._holdings = holdings
        self._expected = expected
        self._next_run = now + limits.eviction_interval_s
        self.evicted_blocks = 0
        self.evicted_contexts = 0
        self.runs = 0

    def tick(self, now: float) -> None:
        """Called on every call into the table: the pass when it is due, else expiry."""
        if now >= self._next_run:
            self.run(now)
        else:
            self._expected.expire(now)

    def run(self, now: float) -> None:
        """The eviction pass: expire router-side entries, enforce every cap."""
        self._expected.expire(now)
        cap = self._limits.max_prefixes_per_context
        for store in list(self._stores.values()):
            if len(store.held) > cap:
                self.trim(store)
        while len(self._stores) > self._limits.max_contexts:
            oldest = min(self._stores.values(), key=_last_access)
            self._drop_store(oldest)
        self._next_run = now + self._limits.eviction_interval_s
        self.runs += 1

    def store_for(self, context: ModelContext, now: float) -> PrefixStore:
        """The store of `context`; a new one may push out the least recently used other."""
        stores = self._stores
        store = stores.get(context)
        if store is None:
            store = stores[context] = self._new_store(context, now)
            while len(stores) > self._limits.max_contexts:
                oldest = min((s for s in stores.values() if s is not store), key=_last_access)
                self._drop_store(oldest)
        return store

    def trim(self, store: PrefixStore) -> None:
        """Evict the least recently used blocks of a store over its cap."""
        keep = int(self._limits.max_prefixes_per_context * _EVICT_TO)
        excess = len(store.held) - keep
        if excess <= 0:
            return
        if self._kill_all(store, store.lru(excess)):  # chains tail first (see `lru`)
            self._sweep_dead_refs(store)

    def _drop_store(self, store: PrefixStore) -> None:
        orphaned = self._kill_all(store, list(store.held))
        del self._stores[store.context]
        store.alive = False
        self.evicted_contexts += 1
        if orphaned:
            self._sweep_dead_refs(store)
        for state in self._pods.values():
            if state.base is store:
                state.base = None

    def _kill_all(self, store: PrefixStore, hashes: list[int]) -> int:
        """Evict blocks of `store` for every pod; returns how many pod entries point at
        them."""
        kill = self._holdings.kill
        orphaned = sum([kill(store, gw_hash) for gw_hash in hashes])
        self.evicted_blocks += len(hashes)
        return orphaned

    def _sweep_dead_refs(self, store: PrefixStore) -> None:
        """Drop pod entries that point at evicted blocks of `store`, so memory stays
        bounded (their blocks are gone: the pods' bits went with them)."""
        unlink = self._holdings.unlink
        held = store.held
        alive = store.alive
        for state in self._pods.values():
            resolve = state.resolve
            for tier in REAL_TIERS:
                entries = state.entries[tier]
                dead = []
                for engine_hash, target in entries.items():
                    if type(target) is int:
                        if state.base is store and (not alive or target not in held):
                            dead.append(engine_hash)
                        continue
                    where, hashes = resolve(target)
                    if where is store and (not alive or not all(h in held for h in hashes)):
                        dead.append(engine_hash)
                for engine_hash in dead:
                    target = entries.pop(engine_hash)
                    state.copies[tier].pop(engine_hash, None)
                    state.size -= 1
                    _, hashes = resolve(target)
                    for gw_hash in hashes:
                        if gw_hash in held:  # a multi-block entry partly evicted
                            unlink(state, store, gw_hash, tier)
                refs = state.extra_refs[tier]
                if refs:
                    for key in [k for k in refs if _dead_key(state, store, k)]:
                        del refs[key]


def _dead_key(state: IndexedPod, store: PrefixStore, key: int | tuple[PrefixStore, int]) -> bool:
    where, gw_hash = state.unkey(key)
    return where is store and (not store.alive or gw_hash not in store.held)
