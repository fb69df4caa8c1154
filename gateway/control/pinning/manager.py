"""PinManager: pins prompt prefixes on the pod that holds them, keeps the engine's pin
counts equal to the lease book's, and lets leases go when they expire.

- A pin resolves the prompt's gateway blocks to the pod's own engine hashes through the
  index, checks the pod's budget (a fraction of its KV cache, learned from the engine),
  and calls the engine. A lease whose blocks are not stored yet waits ("pending") and is
  pinned by the reconciliation loop once they are.
- Reconciliation, every `interval_s`: expired leases are unpinned; a pod whose index was
  cleared (AllBlocksCleared, engine restart, lost events) or that no longer holds a block
  we pinned (the engine auto-unpinned, then evicted it) has every pin of ours dropped once
  (unpinning what we counted, so the engine ends at zero whether it kept them or not), and
  its leases are pinned again as soon as the index shows their blocks stored again.
- An engine answering 404 on the pin endpoint is marked "no pin support": pin requests
  for it fail with a clear error; request-level leases still keep their session's pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.control.pinning.client import NoPinSupport, PinCallError, PinClient
from gateway.control.pinning.leases import Lease, LeaseBook, Source, packed_tokens
from gateway.control.pinning.metrics import PinMetrics
from gateway.control.registry import PodRegistry
from gateway.errors import BadRequest, GatewayError, PinFailed, PinRefused
from indexer import EngineHash, ModelContext, SyncPrefixHashTable, Tier, UnknownPodError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PinConfig:
    """The pin settings (`KVGATE_PIN_*`, declared with their defaults in
    gateway/settings.py)."""

    budget_fraction: float
    """Pinned blocks per pod may not exceed this share of its GPU KV cache blocks."""
    default_ttl_s: float
    max_ttl_s: float
    max_leases: int
    max_leases_per_pod: int
    interval_s: float
    """Reconciliation and lease expiry period."""
    settle_timeout_s: float = 10.0
    """How long a request-level pin waits for the prompt's blocks to be stored."""


class PinManager:
    def __init__(
        self,
        *,
        table: SyncPrefixHashTable,
        registry: PodRegistry,
        client: PinClient,
        metrics: PinMetrics,
        config: PinConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._table = table
        self._registry = registry
        self._client = client
        self._metrics = metrics
        self.config = config
        self._clock = clock
        self.book = LeaseBook()
        self._capacity: dict[str, int] = {}
        self._no_pin_support: set[str] = set()
        self._lock = asyncio.Lock()  # one engine pin/unpin sequence at a time
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the API ------------------------------------------------------------------------

    async def pin(
        self,
        *,
        model: str,
        context: ModelContext,
        tokens: list[int],
        pod: str,
        ttl_s: float | None = None,
        source: Source = "admin",
        session: str | None = None,
    ) -> Lease:
        """A new lease for this prompt on `pod`, pinned now if its blocks are stored."""
        if pod in self._no_pin_support:
            self._refused("no_pin_support")
            raise PinRefused(self._no_support_message(pod), reason="no_pin_support")
        if self._registry.index_mode(pod) == "approximate":
            self._refused("no_kv_events")
            raise PinRefused(
                f"pod {pod} publishes no KV events: the gateway does not know its engine "
                "hashes, so it cannot pin there",
                reason="no_kv_events",
            )
        now = self._clock()
        ttl = self._ttl(ttl_s)
        self._check_caps(pod)
        lease = Lease(
            id=self.book.new_id(),
            pod=pod,
            model=model,
            context=context,
            tokens=packed_tokens(tokens),
            gateway_hashes=self._table.prefix_hashes(tokens),
            ttl_s=ttl,
            expires_at=now + ttl,
            created_at=now,
            source=source,
            session=session,
        )
        async with self._lock:
            self.book.add(lease)
            try:
                await self._pin_lease(lease, strict=True)
            except GatewayError:
                self.book.remove(lease)
                raise
            finally:
                self._publish_gauges()
        return lease

    async def unpin(self, lease_id: str) -> Lease | None:
        lease = self.book.get(lease_id)
        if lease is None:
            return None
        async with self._lock:
            await self._end(lease)
            self._publish_gauges()
        return lease

    def leases(self) -> list[Lease]:
        return list(self.book)

    def pod_views(self) -> dict[str, dict[str, Any]]:
        """Per pod with pins (or known limits): pinned blocks, budget, pin support."""
        names = self.book.pods() | set(self._capacity) | self._no_pin_support
        views: dict[str, dict[str, Any]] = {}
        for name in sorted(names):
            capacity = self._capacity.get(name)
            views[name] = {
                "pinned_blocks": self.book.pinned_blocks(name),
                "leases": len(self.book.on_pod(name)),
                "capacity_blocks": capacity,
                "budget_blocks": (
                    int(capacity * self.config.budget_fraction) if capacity is not None else None
                ),
                "pin_support": name not in self._no_pin_support,
            }
        return views

    def affinity(self, model: str, context: ModelContext, session: str | None,
                 hashes: Sequence[int]) -> str | None:  # fmt: skip
        """The pod a request should stay on: its session's lease, else the conversation
        lease whose prefix this prompt extends."""
        if not len(self.book):
            return None
        if session is not None:
            lease = self.book.by_session(model, session)
            if lease is not None:
                return lease.pod
        # Only conversations (request-level leases): an admin pin of a shared system prompt
        # must not pull every request that starts with it onto one pod; prefix scoring
        # already favours the pod holding it.
        extended = self.book.extended_by(context, hashes, "request") if hashes else None
        return extended.pod if extended is not None else None

    async def pin_session_turn(
        self,
        *,
        model: str,
        context: ModelContext,
        tokens: list[int],
        pod: str,
        ttl_s: float | None,
        session: str | None,
    ) -> None:
        """After a turn of an opted-in conversation was served by `pod`: once its prompt's
        blocks are stored, pin them under the conversation's lease (new or renewed)."""
        hashes = self._table.prefix_hashes(tokens)
        deadline = self._clock() + self.config.settle_timeout_s
        # The engine announces the blocks after the prefill; poll the index (no event to wait on).
        while self._held_prefix(pod, context, tokens) < len(hashes):
            if self._clock() >= deadline:
                break
            await asyncio.sleep(0.05)
        lease = self.book.by_session(model, session) if session is not None else None
        lease = lease or self.book.extended_by(context, hashes, "request")
        try:
            if lease is None or lease.pod != pod:
                if lease is not None:  # the session moved: its old pod's pin goes
                    await self.unpin(lease.id)
                await self.pin(model=model, context=context, tokens=tokens, pod=pod,
                               ttl_s=ttl_s, source="request", session=session)  # fmt: skip
                return
            async with self._lock:
                ttl = self._ttl(ttl_s)
                lease.ttl_s, lease.expires_at = ttl, self._clock() + ttl
                lease.tokens, lease.gateway_hashes, lease.complete = (
                    packed_tokens(tokens),
                    hashes,
                    False,
                )
                lease.checked_at = None
                if session is not None and lease.session is None:
                    lease.session = session
                    self.book.add(lease)
                if not lease.unsupported:
                    await self._pin_lease(lease, strict=False)
                self._publish_gauges()
        except PinRefused as exc:
            # No pin support: keep a pin-less lease so that routing still keeps the session.
            if exc.code == "no_pin_support" and (lease is None or lease.pod != pod):
                now, ttl = self._clock(), self._ttl(ttl_s)
                stub = Lease(self.book.new_id(), pod, model, context, packed_tokens(tokens), hashes,
                             ttl, now + ttl, now, "request", session, unsupported=True)  # fmt: skip
                self.book.add(stub)
            logger.info("session pin on %s refused: %s", pod, exc.message)
        except GatewayError as exc:
            logger.warning("session pin on %s failed: %s", pod, exc.message)

    def schedule(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a coroutine owned by the manager (cancelled by `close`)."""
        task = asyncio.create_task(work, name="kvgate-session-pin")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.reconcile()
            except Exception:  # one bad round must not end pinning for good
                logger.exception("pin reconciliation failed")

    async def reconcile(self) -> None:
        """Expire leases, detect pins the engine lost, (re-)pin what is stored again."""
        async with self._lock:
            now = self._clock()
            for lease in self.book.expired(now):
                await self._end(lease)
                self._metrics.pin_lease_expiries.inc()
            for pod in sorted(self.book.pods()):
                await self._reconcile_pod(pod)
            self._publish_gauges()

    async def close(self) -> None:
        """Shutdown: stop pending session pins, unpin every lease (best effort)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        async with self._lock:
            for lease in self.book:
                await self._end(lease)
            self._publish_gauges()

    # -- internals ------------------------------------------------------------------------

    async def _reconcile_pod(self, pod: str) -> None:
        if not self._table.has_pod(pod):
            return  # gone or not Ready: nothing to verify against until it is back
        epoch = self._table.pod_epoch(pod)
        ledger = self.book.ledger(pod)
        known = self.book.epoch(pod)
        lost = known is not None and known != epoch
        held = self._table.held_tiers(pod, list(ledger)) if ledger else {}
        if ledger and len(held) < len(ledger):
            lost = True
        self.book.set_epoch(pod, epoch)
        if lost:
            await self._drop_pod_pins(pod)
        generation = self._table.pod_generation(pod)
        for lease in self.book.on_pod(pod):
            if lease.complete or lease.unsupported:
                self._update_tiers(lease)
                continue
            if lease.checked_at == generation and not lost:
                continue  # nothing changed in the pod's index since it was last resolved
            lease.checked_at = generation
            try:
                await self._pin_lease(lease, strict=False)
            except GatewayError as exc:
                logger.info("pin of lease %s on %s not renewed: %s", lease.id, pod, exc.message)

    async def _drop_pod_pins(self, pod: str) -> None:
        counted = self.book.drop_pod_pins(pod)
        logger.info("pins on %s were lost or may be: re-pinning its leases", pod)
        if counted:
            await self._call("unpin", pod, counted)

    async def _pin_lease(self, lease: Lease, *, strict: bool) -> None:
        """Pin the lease's resolvable prefix if it grew; with `strict`, raise refusals."""
        pod = lease.pod
        if not self._table.has_pod(pod):
            return
        resolved = self._table.engine_blocks(pod, lease.context, lease.tokens)
        hashes = [h for h, _ in resolved]
        whole = self._held_prefix(pod, lease.context, lease.tokens) == len(lease.gateway_hashes)
        if not hashes or set(hashes) <= set(lease.held):
            lease.complete = bool(lease.held) and whole
            self._update_tiers(lease)
            return
        budget = await self._budget(pod)
        if budget is None or self.book.would_hold(pod, hashes) > budget:
            if budget is None:
                reason, message = "unknown_capacity", f"the KV cache size of {pod} is unknown"
            else:
                reason = "budget"
                message = (
                    f"pinning {len(hashes)} blocks on {pod} would exceed its pin budget of "
                    f"{budget} blocks ({self.config.budget_fraction:.0%} of its KV cache); "
                    f"{self.book.pinned_blocks(pod)} are pinned"
                )
            self._refused(reason)
            if strict:
                raise PinRefused(message, reason=reason)
            return
        self.book.set_epoch(pod, self._table.pod_epoch(pod))
        count = await self._call("pin", pod, hashes)
        if count != len(hashes):
            # Some blocks went between the index's view and the call: undo, retry later.
            await self._call("unpin", pod, hashes)
            return
        old = self.book.release(lease)
        self.book.hold(lease, hashes)
        if old:
            await self._call("unpin", pod, old)
        if lease.lost:
            lease.lost = False
            self._metrics.repins.inc()
        lease.complete = whole
        self._update_tiers(lease)

    async def _end(self, lease: Lease) -> None:
        self.book.remove(lease)
        held = self.book.release(lease)
        if held:
            with contextlib.suppress(GatewayError):
                await self._call("unpin", lease.pod, held)

    async def _call(self, op: str, pod: str, hashes: list[EngineHash]) -> int:
        state = self._registry.get(pod)
        if state is None:
            raise PinFailed(f"pod {pod} is gone")
        try:
            if op == "pin":
                count = await self._client.pin(state.pod.url, hashes)
            else:
                count = await self._client.unpin(state.pod.url, hashes)
        except NoPinSupport as exc:
            self._metrics.pin_calls.labels(op, "error").inc()
            self._no_pin_support.add(pod)
            self._refused("no_pin_support")
            logger.warning("%s: marked as having no pin support", exc)
            raise PinRefused(self._no_support_message(pod), reason="no_pin_support") from None
        except PinCallError as exc:
            self._metrics.pin_calls.labels(op, "error").inc()
            raise PinFailed(str(exc)) from None
        self._metrics.pin_calls.labels(op, "ok").inc()
        return count

    async def _budget(self, pod: str) -> int | None:
        capacity = self._capacity.get(pod)
        state = self._registry.get(pod)
        if capacity is None and state is not None:
            found = await self._client.capacity_blocks(state.pod.url)
            if found is not None:
                capacity = self._capacity[pod] = found
        if capacity is None:
            return None
        return int(capacity * self.config.budget_fraction)

    def _held_prefix(self, pod: str, context: ModelContext, tokens: Sequence[int]) -> int:
        """Leading gateway blocks of `tokens` the pod holds in a real tier."""
        try:
            match = self._table.match(context, self._table.prefix_hashes(tokens), [pod])
        except UnknownPodError:
            return 0
        tiers = match.tiers(pod)
        return next((i for i, tier in enumerate(tiers) if tier is Tier.EXPECTED), len(tiers))

    def _update_tiers(self, lease: Lease) -> None:
        if not lease.held or not self._table.has_pod(lease.pod):
            lease.tiers = {}
            return
        counts: dict[Tier, int] = {}
        for tier in self._table.held_tiers(lease.pod, lease.held).values():
            counts[tier] = counts.get(tier, 0) + 1
        lease.tiers = counts

    def _ttl(self, ttl_s: float | None) -> float:
        ttl = self.config.default_ttl_s if ttl_s is None else ttl_s
        if not 0 < ttl <= self.config.max_ttl_s:
            raise BadRequest(f"ttl_s must be in (0, {self.config.max_ttl_s:g}]", param="ttl_s")
        return ttl

    def _check_caps(self, pod: str) -> None:
        """Leases are bounded in number, in total and per pod: each costs memory and engine
        calls for as long as it lives."""
        config = self.config
        on_pod = sum(1 for lease in self.book if lease.pod == pod)
        if len(self.book) >= config.max_leases or on_pod >= config.max_leases_per_pod:
            self._refused("lease_cap")
            raise PinRefused(
                f"too many pin leases (at most {config.max_leases} in all and "
                f"{config.max_leases_per_pod} per pod; {pod} has {on_pod})",
                reason="lease_cap",
            )

    def _refused(self, reason: str) -> None:
        self._metrics.pin_refusals.labels(reason).inc()

    @staticmethod
    def _no_support_message(pod: str) -> str:
        return (
            f"pod {pod} has no pin support (its engine answers 404 on /hicache/pin_blocks: "
            "upstream SGLang or vLLM); requests still route to it by prefix and session"
        )

    def _publish_gauges(self) -> None:
        active: dict[str, int] = {}
        for lease in self.book:
            active[lease.pod] = active.get(lease.pod, 0) + 1
        for state in self._registry.all():
            name = state.name
            self._metrics.pins_active.labels(name).set(active.get(name, 0))
            self._metrics.pinned_blocks.labels(name).set(self.book.pinned_blocks(name))
