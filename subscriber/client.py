"""One pod's KV event subscriber: ZMQ SUB for live batches, DEALER for replay.

The index must equal what the engine holds, so every batch is applied exactly once, in
seq order, and every doubt is settled by asking the engine's replay buffer:

- start: replay from 0, buffering live batches meanwhile, then continue live;
- seq == next: apply;
- seq > next (a gap) or seq < next (a restart, or garbage): replay from the *last applied*
  seq and compare that batch's digest with the one applied. Same batch → the engine's
  history is ours: apply what follows (nothing follows → the odd seq was bogus). Missing
  or different → the engine restarted: reset the pod, replay from 0. First replayed seq
  later than asked → the buffer no longer reaches back: reset, rebuild from what it has,
  and mark the pod *degraded* (its index may miss blocks) until an AllBlocksCleared or an
  engine restart gives a known-empty start again;
- silence for `idle_probe_s`: the same replay check, so a lost *last* batch (or an engine
  that restarted and has published nothing) is noticed without waiting for traffic;
- replay unavailable (no endpoint, timeout): reset, take the next live batch as the new
  baseline, degraded — unless that batch is seq 0 (the engine just started: nothing missed).
  When the replay answers again, the engine's history tells whether it restarted meanwhile,
  whatever its seq reached: an empty buffer, one that ends before the last seq we applied,
  or a different batch at that seq is a new engine (counted and logged as a restart).

A batch that cannot be decoded is counted (per pod, per reason) and skipped; it never
stops the subscriber. The live queue is bounded: on overflow the newest batches are
dropped, which shows up as a gap and is repaired by replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable

import xxhash
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from subscriber.events import AllBlocksCleared, DecodeError, KVEventBatch, decode_batch
from subscriber.frames import ReplayEntry, decode_pub_message
from subscriber.live_queue import LiveQueue
from subscriber.rejects import RejectCounter
from subscriber.replay import ReplayUnavailableError, fetch_replay
from subscriber.sink import BatchSink
from subscriber.socket_reader import SocketReader
from subscriber.status import (
    Phase,
    PodEndpoint,
    PodSubscriberStatus,
    ResumePoint,
    SubscriberCounters,
    SubscriberSettings,
)
from subscriber.zap import domain_of

logger = logging.getLogger(__name__)

# Work done between yields to the event loop: a backlog (a replay, a burst) must never
# stall the gateway's request handling or the other pods' subscribers.
_YIELD_EVERY = 32

_CONNECTION_UP = zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED
_CONNECTION_DOWN = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


class PodSubscriber:
    """Keeps one pod's entries in the sink equal to what the pod's engine holds."""

    def __init__(
        self,
        endpoint: PodEndpoint,
        *,
        context: zmq.asyncio.Context,
        sink: BatchSink,
        rejects: RejectCounter,
        settings: SubscriberSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        resume: ResumePoint | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._context = context
        self._sink = sink
        self._rejects = rejects
        self._settings = settings or SubscriberSettings()
        self._clock = clock
        self._rng = rng or random.Random()
        self._phase = Phase.STARTING
        self._connected = False
        self._last_seq: int | None = None
        self._last_digest = 0
        # seq -> digest of recently applied batches: a live batch already applied by a
        # replay is recognised as a duplicate, not mistaken for an engine restart.
        self._recent: dict[int, int] = {}
        self._recent_order: deque[int] = deque()
        self._whole = False
        self._degraded_reason: str | None = "not started"
        # Set when no replay could settle a doubt: the next live batch, whatever its seq,
        # becomes the new baseline of a reset pod.
        self._rebaseline = False
        # Set when the event socket lost or (re)made its connection: the engine may have
        # restarted and reached our seq again meanwhile, which no seq check notices, so the
        # next live batch first checks the last applied one against the replay buffer.
        self._verify = False
        # Whether the index holds anything applied since the last reset: a reset of an
        # index never built (the first build, a second reset in a row) is no news.
        self._built = False
        self._unreachable_at: tuple[int, int] | None = None
        """Our last applied (seq, digest) when a reset found the replay socket unreachable:
        what the engine's history must still hold if it did not restart meanwhile."""
        self._counters = SubscriberCounters()
        self._last_message_at: float | None = None
        self._queue = LiveQueue(self._settings.live_queue)
        # A restored index that was whole: whole again once the engine's replay confirmed
        # its history (not before: until then it may lack the batches since the snapshot).
        self._restored_whole = False
        if resume is not None:
            # The sink already holds the pod's index as of `resume`: the first session
            # checks the engine's replay against it like after a reconnect.
            self._last_seq, self._last_digest = resume.seq, resume.digest
            self._restored_whole = resume.whole
            self._built = True
            self._degrade("restored from a snapshot: checking the engine's replay")

    # -- public ---------------------------------------------------------------------------

    def status(self) -> PodSubscriberStatus:
        counters = self._counters
        return PodSubscriberStatus(
            pod=self.endpoint.name,
            phase=self._phase,
            connected=self._connected,
            last_seq=self._last_seq,
            whole=self._whole,
            degraded_reason=self._degraded_reason,
            batches_applied=counters.batches_applied,
            replays=counters.replays,
            restarts=counters.restarts,
            gaps=counters.gaps,
            idle_probes=counters.idle_probes,
            live_dropped=counters.live_dropped,
            frames_rejected=counters.frames_rejected,
            last_message_at=self._last_message_at,
            resets=dict(counters.resets),
        )

    def resume_point(self) -> ResumePoint | None:
        """Where the sink's entries for this pod stand now (None while they are rebuilt)."""
        if self._last_seq is None:
            return None
        return ResumePoint(self._last_seq, self._last_digest, self._whole or self._restored_whole)

    async def run(self) -> None:
        """Subscribe until cancelled, reconnecting with capped exponential backoff."""
        delay = self._settings.reconnect_initial_s
        try:
            while True:
                started = self._clock()
                try:
                    await self._session()
                except (zmq.ZMQError, OSError) as exc:
                    logger.warning("kv events of %s: %s; reconnecting", self.endpoint.name, exc)
                except Exception:
                    # A bug must not silently end this pod's subscription: log it, start over.
                    logger.exception("kv events of %s: subscriber failed", self.endpoint.name)
                if self._clock() - started > self._settings.reconnect_max_s:
                    delay = self._settings.reconnect_initial_s  # it had been healthy
                self._phase = Phase.BACKOFF
                self._connected = False
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
                delay = min(delay * 2, self._settings.reconnect_max_s)
        finally:
            self._phase = Phase.STOPPED
            self._connected = False

    # -- one socket lifetime --------------------------------------------------------------

    async def _session(self) -> None:
        sub, monitor = self._open_sub()
        name = self.endpoint.name
        tasks = [
            asyncio.create_task(self._read_live(sub), name=f"kv-live-{name}"),
            asyncio.create_task(self._watch_connection(sub, monitor), name=f"kv-mon-{name}"),
        ]
        tasks[0].add_done_callback(lambda _reader: self._queue.wake())
        try:
            if self._last_seq is None:
                await self._replay_from_start()
            else:
                await self._catch_up("reconnected")
            self._phase = Phase.LIVE
            handled = 0
            while True:
                item = await self._next_live(tasks[0])
                if item is None:
                    await self._probe_idle()
                    continue
                seq, payload = item
                await self._on_live(seq, payload)
                handled += 1
                if handled % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # a ready queue never suspends by itself
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
                    await task
            sub.close(linger=0)

    def _open_sub(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        """The SUB socket, and its monitor (attached before connecting, so no event is missed)."""
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self._settings.live_queue)
        sub.setsockopt(zmq.MAXMSGSIZE, self._settings.decode_limits.max_payload_bytes + 4096)
        sub.setsockopt(zmq.RECONNECT_IVL, int(self._settings.reconnect_initial_s * 1000))
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, int(self._settings.reconnect_max_s * 1000))
        sub.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
        monitor = sub.get_monitor_socket(_CONNECTION_UP | _CONNECTION_DOWN)
        if self.endpoint.bind:
            if self.endpoint.allowed_peers:  # the manager's ZAP guard checks each peer
                sub.setsockopt(zmq.ZAP_DOMAIN, domain_of(self.endpoint.name))
            sub.bind(self.endpoint.events)
        else:
            sub.connect(self.endpoint.events)
        return sub, monitor

    async def _read_live(self, sub: zmq.asyncio.Socket) -> None:
        queue = self._queue
        received = 0
        reader = SocketReader(sub)
        try:
            while True:
                frames = await reader.recv_multipart()
                received += 1
                if received % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # messages already waiting do not suspend the await
                self._last_message_at = self._clock()
                try:
                    _topic, seq, payload = decode_pub_message(frames)
                except DecodeError as exc:
                    self._reject(exc)
                    continue
                if not queue.put((seq, payload)):
                    self._counters.live_dropped += 1  # the seq gap brings it back by replay
        finally:
            reader.close()

    async def _next_live(self, reader: asyncio.Task[None]) -> tuple[int, bytes] | None:
        """The next live batch; None after `idle_probe_s` without one."""
        if not len(self._queue) and reader.done():
            self._reader_stopped(reader)
        item = await self._queue.take(self._settings.idle_probe_s)
        if item is None and reader.done():
            self._reader_stopped(reader)
        return item

    @staticmethod
    def _reader_stopped(reader: asyncio.Task[None]) -> None:
        reader.result()  # re-raises why the reader stopped
        raise zmq.ZMQError(msg="live reader stopped")

    async def _probe_idle(self) -> None:
        """Silence: make sure it is not silence after a lost batch (or a restarted engine)."""
        if self.endpoint.replay is None:
            return
        self._counters.idle_probes += 1
        if self._rebaseline:
            # The replay socket did not answer before (engine down?): it may now.
            await self._replay_from_start()
            return
        await self._catch_up("idle probe", probe=True)

    async def _watch_connection(self, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] & _CONNECTION_UP:
                    self._connected = True
                    self._verify = True  # whoever is at the other end now, check first
                elif event["event"] & _CONNECTION_DOWN:
                    self._connected = False
                    self._verify = True
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)

    # -- live batches ---------------------------------------------------------------------

    async def _on_live(self, seq: int, payload: bytes) -> None:
        batch = self._decode(payload)
        if batch is None:
            # Not applied and `last_seq` not advanced: garbage is ignored whatever its seq,
            # and a real batch that cannot be decoded shows up as a gap at the next one.
            return
        verifiable = self._last_seq is not None and self.endpoint.replay is not None
        if self._verify and verifiable and not self._rebaseline:
            await self._catch_up("event socket reconnected")
        if self._rebaseline and self.endpoint.replay is not None and await self._rebuilt():
            # The engine publishes again and its replay socket answered this time: a whole
            # rebuild beats a baseline that would leave the pod degraded for good (and its
            # history says whether the engine restarted).
            await self._on_live(seq, payload)
            return
        silent_at = self._unreachable_at
        if self._rebaseline and silent_at is not None and seq <= silent_at[0]:
            # Reset while its replay socket was unreachable, still no replay; publishing
            # again from a seq at or below the last one we had: the engine restarted.
            self._engine_restarted(f"publishing from seq {seq} again after it went silent")
        if self._rebaseline:
            self._rebaseline = False
            if seq == 0:
                self._mark_whole()  # a fresh engine: we see it from its first batch
            self._apply(seq, payload, batch)
            return
        expected = 0 if self._last_seq is None else self._last_seq + 1
        if seq == expected:
            self._apply(seq, payload, batch)
            return
        if seq < expected and self._recent.get(seq) == _digest(payload):
            return  # a batch the replay already applied
        if seq > expected:
            self._counters.gaps += 1
        if not await self._catch_up(f"live seq {seq}, expected {expected}"):
            await self._on_live(seq, payload)  # nothing settled it: the new baseline

    def _decode(self, payload: bytes) -> KVEventBatch | None:
        try:
            return decode_batch(payload, limits=self._settings.decode_limits)
        except DecodeError as exc:
            self._reject(exc)
            return None

    def _apply(self, seq: int, payload: bytes, batch: KVEventBatch) -> None:
        self._sink.apply(self.endpoint.name, batch)
        self._counters.batches_applied += 1
        self._advance(seq, payload)
        self._built = True
        if any(isinstance(event, AllBlocksCleared) for event in batch.events):
            self._mark_whole()  # the engine is empty: whatever we missed is gone
            self._count_reset("cleared", "the engine cleared its cache (AllBlocksCleared)")

    def _advance(self, seq: int, payload: bytes) -> None:
        digest = _digest(payload)
        self._last_seq = seq
        self._last_digest = digest
        self._recent[seq] = digest
        self._recent_order.append(seq)
        while len(self._recent_order) > self._settings.live_queue:
            self._recent.pop(self._recent_order.popleft(), None)

    # -- replay ---------------------------------------------------------------------------

    async def _replay_from_start(self, cause: str | None = None) -> None:
        """Rebuild the pod from the engine's whole replay buffer (`cause`: why its index
        is thrown away, when that is news)."""
        self._reset(degraded="replaying", cause=cause)
        try:
            entries = await self._replay(0)
        except ReplayUnavailableError as exc:
            self._degrade(f"no replay ({exc}): the index holds only batches seen live")
            self._rebaseline = True
            return
        silent_at = self._unreachable_at
        if silent_at is not None:
            self._unreachable_at = None
            why = _new_history(entries, *silent_at)
            if why is not None:
                self._engine_restarted(why)
        if entries and entries[0].seq != 0:
            self._degrade(f"replay buffer starts at seq {entries[0].seq}: older blocks unknown")
        else:
            self._mark_whole()
        await self._apply_entries(entries)

    async def _rebuilt(self) -> bool:
        """Replay from the start again; True when the replay socket answered this time."""
        await self._replay_from_start()
        return not self._rebaseline

    async def _catch_up(self, why: str, *, probe: bool = False) -> bool:
        """Settle a gap, an odd seq or a reconnect by replaying from the last applied seq.
        A `probe` (silence, nothing known to be wrong) is counted as an idle probe, not as a
        replay: an idle pod would otherwise show a replay every `idle_probe_s`.

        False when no replay could settle it: the pod was reset and the next live batch
        becomes its new baseline.
        """
        self._verify = False  # whatever the reason, this checks the engine's history
        restored_whole, self._restored_whole = self._restored_whole, False
        last, digest = self._last_seq, self._last_digest
        if last is None:
            await self._replay_from_start()
            return not self._rebaseline
        try:
            entries = await self._replay(last, counted=not probe)
        except ReplayUnavailableError as exc:
            self._reset(degraded=f"{why}; no replay ({exc}): pod reset", cause="replay_unavailable")
            self._rebaseline = True
            self._unreachable_at = (last, digest)
            return False
        if not entries or entries[0].seq < last:
            self._engine_restarted(why)
            await self._replay_from_start(cause="engine_restart")
        elif entries[0].seq > last:
            lost = f"seq {last + 1}..{entries[0].seq - 1} lost"
            self._reset(degraded=f"{why}; replay buffer overrun ({lost})", cause="replay_overrun")
            await self._apply_entries(entries)
        elif _digest(entries[0].payload) != self._last_digest:
            self._engine_restarted(why)
            await self._replay_from_start(cause="engine_restart")
        else:
            if restored_whole:
                self._mark_whole()  # the restored index is the engine's history: confirmed
            await self._apply_entries(entries[1:])
        return not self._rebaseline

    async def _replay(self, start: int, *, counted: bool = True) -> list[ReplayEntry]:
        if self.endpoint.replay is None:
            raise ReplayUnavailableError("the pod has no replay endpoint")
        if counted:
            self._counters.replays += 1
        previous_phase, self._phase = self._phase, Phase.REPLAYING
        try:
            return await fetch_replay(
                self._context,
                self.endpoint.replay,
                start,
                timeout_s=self._settings.replay_timeout_s,
                max_message_bytes=self._settings.decode_limits.max_payload_bytes + 4096,
                on_reject=self._reject,
            )
        finally:
            self._phase = previous_phase

    async def _apply_entries(self, entries: list[ReplayEntry]) -> None:
        for position, entry in enumerate(entries, 1):
            if position % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if self._last_seq is not None and entry.seq != self._last_seq + 1:
                self._degrade(f"replay skipped from seq {self._last_seq} to {entry.seq}")
            batch = self._decode(entry.payload)
            if batch is None:  # the engine's own copy is unreadable: step over it
                self._advance(entry.seq, entry.payload)
                self._degrade(f"batch {entry.seq} could not be decoded")
                continue
            self._apply(entry.seq, entry.payload, batch)

    # -- state ----------------------------------------------------------------------------

    def _reset(self, *, degraded: str, cause: str | None = None) -> None:
        """Throw the pod's index away; `cause` counts it (None: nothing was built since the
        last counted reset, e.g. the first build)."""
        if cause is not None and self._built:
            self._count_reset(cause, degraded)
        self._built = False
        self._sink.reset(self.endpoint.name)
        self._rebaseline = False
        self._last_seq = None
        self._last_digest = 0
        self._recent.clear()
        self._recent_order.clear()
        self._degrade(degraded)

    def _engine_restarted(self, why: str) -> None:
        self._unreachable_at = None  # settled: the same restart is not counted twice
        self._counters.restarts += 1
        logger.info("kv events of %s: engine restarted (%s); rebuilding", self.endpoint.name, why)

    def _count_reset(self, cause: str, detail: str) -> None:
        resets = self._counters.resets
        resets[cause] = resets.get(cause, 0) + 1
        if cause != "engine_restart":  # _engine_restarted said it already
            logger.info("kv events of %s: index reset (%s): %s", self.endpoint.name, cause, detail)

    def _degrade(self, reason: str) -> None:
        self._whole = False
        self._degraded_reason = reason

    def _mark_whole(self) -> None:
        self._whole = True
        self._degraded_reason = None

    def _reject(self, exc: DecodeError) -> None:
        self._counters.frames_rejected += 1
        verdict = self._rejects.record(self.endpoint.name, exc.reason)
        if verdict.should_log:
            logger.warning(
                "kv events of %s: rejected a frame (%s: %s)%s",
                self.endpoint.name,
                exc.reason,
                exc.detail,
                f"; {verdict.suppressed} more since the last report" if verdict.suppressed else "",
            )


def _new_history(entries: list[ReplayEntry], seq: int, digest: int) -> str | None:
    """Why the engine whose whole replay buffer is `entries` is not the one whose batch
    `seq` (with `digest`) we applied last; None if it is, or if its buffer no longer
    reaches back to `seq` (nothing tells then)."""
    if not entries:
        return f"its replay buffer is empty; seq {seq} was applied before it went silent"
    if entries[-1].seq < seq:
        return f"its replay ends at seq {entries[-1].seq}; seq {seq} was applied before"
    for entry in entries:
        if entry.seq == seq:
            if _digest(entry.payload) == digest:
                return None
            return f"its batch {seq} is not the one applied before it went silent"
    return None


def _digest(payload: bytes) -> int:
    return xxhash.xxh64_intdigest(payload)
