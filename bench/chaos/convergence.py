"""Does the gateway's index equal what each engine holds?

Per pod, a *consistent* comparison reads the engine's publisher seq and its unpublished
events (`/sim/stats`), its cache (`/sim/cache`), the gateway's index of that pod
(`/admin/index?pod=`) and the seq again: when the engine had nothing unpublished and
published nothing in between, and the gateway has applied exactly up to that seq, both
sides describe the same moment and must be equal, block for block and tier for tier.
Under steady traffic a comparison is retried until such a moment comes.

`missing` = blocks the engine holds that the index lacks (lost routing hits);
`phantom` = blocks the index holds that the engine does not (routing to a cold pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.fleet import EngineEndpoint
from bench.harness.gateway import AdminClient

_TIERS = ("GPU", "CPU", "STORAGE")
# Degraded states no amount of waiting repairs (the index holds only what it saw).
PERMANENT = ("overrun", "replay buffer starts at", "holds only", "could not be decoded")


@dataclass(frozen=True, slots=True)
class PodComparison:
    pod: str
    engine_blocks: int
    index_blocks: int
    missing: int
    phantom: int
    examples: dict[str, list[Any]] = field(default_factory=dict)
    """A few missing and phantom (tier, hash) pairs, to investigate a divergence."""

    @property
    def divergent(self) -> int:
        return self.missing + self.phantom


@dataclass
class Convergence:
    converged: bool
    seconds: float
    """From the fault settling to every pod whole and equal (or to giving up)."""
    comparisons: list[PodComparison] = field(default_factory=list)
    not_whole: dict[str, str | None] = field(default_factory=dict)
    """Pods still not whole when giving up, with the gateway's reason."""
    divergent_examples: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    """Per pod, examples from the last divergent consistent comparison seen."""
    waits: dict[str, int] = field(default_factory=dict)
    """Why each check round failed: `not_whole`, `inconsistent` (no consistent moment for
    some pod), `divergent`, `error` (a request failed) — to see what a slow one waited on."""

    @property
    def divergent(self) -> int:
        return sum(c.divergent for c in self.comparisons)

    @property
    def missing(self) -> int:
        return sum(c.missing for c in self.comparisons)

    @property
    def phantom(self) -> int:
        return sum(c.phantom for c in self.comparisons)


class ConvergenceChecker:
    def __init__(
        self,
        admin: AdminClient,
        engines: Sequence[EngineEndpoint],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admin = admin
        self._engines = list(engines)
        self._clock = clock

    async def subscribers(self) -> dict[str, dict[str, Any]]:
        return {p["name"]: (p.get("subscriber") or {}) for p in await self._admin.pods()}

    async def compare(self, engine: EngineEndpoint) -> PodComparison | None:
        """One consistent comparison of `engine`'s pod, or None if none was possible now."""
        seq, pending = await self._engine_seq(engine)
        cache = await self._get(f"{engine.url}/sim/cache")
        index = await self._admin.get("/admin/index", pod=engine.name)
        if pending or await self._engine_seq(engine) != (seq, 0):
            return None  # the engine changed its cache meanwhile, or has not published it
        last = index.get("last_seq")
        if (seq == 0 and last is not None) or (seq > 0 and last != seq - 1):
            return None
        truth = {(t, h) for t in _TIERS for h in cache["tiers"].get(t, [])}
        held = {(t, h) for t in _TIERS for h in index["engine_hashes"].get(t, [])}
        missing, phantom = truth - held, held - truth
        examples = {"missing": sorted(missing)[:5], "phantom": sorted(phantom)[:5]}
        return PodComparison(
            engine.name, len(truth), len(held), len(missing), len(phantom), examples
        )

    async def wait_converged(
        self, since: float, timeout_s: float, *, give_up_when_permanent: bool = True
    ) -> Convergence:
        """Until every pod is whole and equal to its engine; at the deadline (or when a pod
        is degraded in a way waiting cannot repair) the last comparisons are returned."""
        deadline = self._clock() + timeout_s
        last: dict[str, PodComparison] = {}
        not_whole: dict[str, str | None] = {}
        waits: Counter[str] = Counter()
        examples: dict[str, dict[str, list[Any]]] = {}
        while True:
            waits["error"] += 1  # taken back below when the round completes
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                subscribers = await self.subscribers()
                not_whole = {
                    name: sub.get("degraded_reason") or sub.get("phase")
                    for name, sub in subscribers.items()
                    if not (sub.get("whole") and sub.get("phase") == "live")
                }
                now: dict[str, PodComparison] = {}
                for engine in self._engines:
                    comparison = await self.compare(engine)
                    if comparison is not None:
                        now[engine.name] = last[engine.name] = comparison
                fresh = len(now) == len(self._engines)
                waits["error"] -= 1
                if not not_whole and fresh and all(c.divergent == 0 for c in now.values()):
                    return Convergence(
                        True, self._clock() - since, list(now.values()), {}, examples, +waits
                    )
                cause = "not_whole" if not_whole else "inconsistent" if not fresh else "divergent"
                waits[cause] += 1
                for c in now.values():  # the worst seen, to tell missing from phantom blocks
                    if c.divergent:
                        examples[c.pod] = c.examples
                    waits[f"max_missing_{c.pod}"] = max(waits[f"max_missing_{c.pod}"], c.missing)
                    waits[f"max_phantom_{c.pod}"] = max(waits[f"max_phantom_{c.pod}"], c.phantom)
                permanent = any(
                    any(marker in str(reason) for marker in PERMANENT)
                    for reason in not_whole.values()
                )
                if give_up_when_permanent and permanent and len(last) == len(self._engines):
                    break
            if self._clock() > deadline:
                break
            await asyncio.sleep(0.05)
        return Convergence(
            False, self._clock() - since, list(last.values()), not_whole, examples, +waits
        )

    async def _engine_seq(self, engine: EngineEndpoint) -> tuple[int, int]:
        """The engine's next seq and how many cache changes it has not published yet."""
        publisher = (await self._get(f"{engine.url}/sim/stats"))["publisher"]
        return int(publisher["next_seq"]), int(publisher.get("pending_events", 0))

    async def _get(self, url: str) -> dict[str, Any]:
        response = await self._admin.client.get(url)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body
