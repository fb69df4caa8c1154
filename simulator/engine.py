"""SimEngine: wires tokenizer, cache, scheduler, event publisher, disk tier and faults.

`start()` validates the disk tier and announces what it still holds, opens the ZMQ
sockets and starts the engine loop and the disk writer; `stop()` cancels and awaits every
task it started and closes the sockets. The HTTP app (`simulator.app`) calls it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import zmq.asyncio

from simulator.block_hash import BLOCK_HASHES
from simulator.cache import PagedPrefixCache
from simulator.cache_types import Tier
from simulator.config import SimConfig
from simulator.disk_tier import DiskTier
from simulator.faults import Faults
from simulator.metrics import EngineMetrics, GaugeReadings
from simulator.publisher import EventPublisher
from simulator.scheduler import Scheduler, SimRequest
from simulator.tokenizer import SimTokenizer
from simulator.wire import EventCollector, EventEncoder, HashCodec

logger = logging.getLogger(__name__)


class EngineBusyError(RuntimeError):
    """An admin operation that needs an idle engine (reset) was asked while requests run."""


class SimEngine:
    def __init__(
        self,
        config: SimConfig,
        *,
        zmq_context: zmq.asyncio.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wall_clock = wall_clock
        self.rng = rng if rng is not None else random.Random(config.seed)
        self.tokenizer = SimTokenizer.load(config.tokenizer)
        self.hasher = BLOCK_HASHES[config.block_hash](config.block_size, config.hash_seed)
        self.codec = HashCodec(config.hash_format, config.flavor)
        self.encoder = EventEncoder(config.event_encoding, config.flavor)
        self.events = EventCollector(self.codec, config.block_size, wall_clock)
        self.disk: DiskTier | None = None
        if config.disk_dir is not None:
            self.disk = DiskTier(config.disk_dir, self.hasher, config.hash_seed, config.disk_queue)
        self.cache = PagedPrefixCache(
            self.hasher,
            self.events,
            gpu_blocks=config.gpu_blocks,
            host_blocks=config.host_blocks,
            disk_blocks=config.disk_blocks if self.disk else 0,
            storage=self.disk,
        )
        self.faults = Faults(clock, random.Random(config.seed + 1))
        self.scheduler = Scheduler(
            self.cache,
            config.latency,
            max_batch=config.max_batch,
            max_batched_tokens=config.max_batched_tokens,
            on_step_end=self._publish_pending,
            clock=clock,
            sleep=sleep,
            extra_delay=self.faults.step_delay,
        )
        self.scheduler.on_first_token = self._first_token
        self.metrics = EngineMetrics(
            model_name=config.model,
            block_size=config.block_size,
            gpu_blocks=config.gpu_blocks,
            host_blocks=config.host_blocks,
            read_gauges=self._gauges,
        )
        self._own_context = zmq_context is None
        self._zmq = zmq_context if zmq_context is not None else zmq.asyncio.Context()
        self.publisher = EventPublisher(
            self._zmq,
            events_endpoint=config.events_endpoint,
            replay_endpoint=config.replay_endpoint,
            topic=config.topic,
            mode=config.events_mode,
            buffer_size=config.replay_buffer,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._ids = itertools.count()
        self.received_request_ids: collections.deque[str] = collections.deque(maxlen=1024)
        """The `X-Request-Id` of each generation request received, latest last (vLLM names
        its request after it); for tests and for following a request through a gateway."""
        self.received_trace_context: collections.deque[tuple[str | None, str | None]] = (
            collections.deque(maxlen=1024)
        )
        """The W3C `traceparent` and `tracestate` of each generation request received (vLLM
        continues the trace they name when it traces), latest last; None where absent."""
        self._publish_lock = asyncio.Lock()
        self.created = int(wall_clock())

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        await self.publisher.start()
        if self.disk is not None:
            entries = await self.disk.load()
            restored = self.cache.restore(entries)
            logger.info(
                "%s: restored %d blocks from %s", self.config.name, restored, self.disk.directory
            )
            self._tasks.append(asyncio.create_task(self.disk.run_writer(), name="disk-writer"))
        self._tasks.append(asyncio.create_task(self.scheduler.run(), name="engine-loop"))
        await self._publish_pending()

    async def stop(self) -> None:
        """Stop the engine loop, drain the disk writer (bounded), then close the sockets."""
        loop_tasks = [t for t in self._tasks if t.get_name() == "engine-loop"]
        await _cancel(loop_tasks)
        if self.disk is not None:
            await self.disk.close()
        await _cancel(self._tasks)
        self._tasks.clear()
        await self.publisher.stop()
        if self._own_context:
            self._zmq.term()

    # ---- requests -------------------------------------------------------------------
    def new_request(self, prompt: list[int], max_tokens: int) -> SimRequest:
        seed_material = f"{self.config.seed}:{len(prompt)}:{prompt[-16:]}".encode()
        request_seed = int.from_bytes(hashlib.sha256(seed_material).digest()[:8], "big")
        request = SimRequest(
            request_id=f"{self.config.name}-{next(self._ids)}",
            prompt=prompt,
            max_tokens=max_tokens,
            rng=random.Random(request_seed),
            vocabulary=self.tokenizer.word_token_ids,
        )
        return request

    def submit(self, request: SimRequest) -> None:
        self.scheduler.submit(request)

    def finish(self, request: SimRequest) -> None:
        """Account a request that ended (completed or aborted by the client)."""
        if not request.finished:
            self.scheduler.abort(request)
            self.metrics.observe_finished(len(request.generated), "abort")
        else:
            self.metrics.observe_finished(len(request.generated), "length")

    def _first_token(self, request: SimRequest) -> None:
        self.metrics.observe_request(len(request.prompt), request.cached_tokens)
        self.metrics.observe_ttft(
            request.first_token_at - request.arrival if request.first_token_at else 0.0
        )

    def _gauges(self) -> GaugeReadings:
        usage = self.cache.gpu_used / self.config.gpu_blocks
        return GaugeReadings(len(self.scheduler.running), len(self.scheduler.waiting), usage)

    async def _publish_pending(self) -> None:
        async with self._publish_lock:
            batch = self.events.take_batch()
            if batch is not None:
                payload = self.encoder.encode(batch)
                overrun = self.faults.take_overrun()
                drop = overrun or self.faults.should_drop_batch()
                await self.publisher.publish(payload, drop=drop, forget=overrun)
            if self.disk is not None:
                await self.disk.wait_for_room()

    # ---- admin ----------------------------------------------------------------------
    def pin(self, hashes: list[Any]) -> int:
        return self.cache.pin(k for k in map(self.codec.key_from_json, hashes) if k is not None)

    def unpin(self, hashes: list[Any]) -> int:
        return self.cache.unpin(k for k in map(self.codec.key_from_json, hashes) if k is not None)

    def busy(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    def flush_cache(self) -> dict[str, int]:
        """SGLang's /flush_cache: selective when pins exist, a full reset otherwise."""
        if self.busy():
            raise EngineBusyError("requests are running or waiting")
        if self.cache.pinned_blocks:
            evicted = self.cache.flush()
            result = {"evicted": evicted, "pinned": self.cache.pinned_blocks}
        else:
            self.cache.reset()
            result = {"evicted": -1, "pinned": 0}
        self.scheduler.poke()
        return result

    def reset_prefix_cache(self) -> None:
        if self.busy():
            raise EngineBusyError("requests are running or waiting")
        self.cache.reset()
        self.scheduler.poke()

    def stats(self) -> dict[str, Any]:
        """Counters for `/sim/stats`: scheduler, publisher, faults fired, disk tier."""
        return {
            "scheduler": asdict(self.scheduler.stats),
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "cache": {
                "gpu_used": self.cache.gpu_used,
                "resident": {t.value: self.cache.count(t) for t in Tier},
                "pinned_blocks": self.cache.pinned_blocks,
            },
            "publisher": {
                "next_seq": self.publisher.next_seq,
                "sent_batches": self.publisher.sent_batches,
                "dropped_batches": self.publisher.dropped_batches,
                "replay_requests": self.publisher.replay_requests,
                "events": self.events.total_events,
                # Events of cache changes not yet published: /sim/cache already shows them.
                "pending_events": len(self.events.pending),
            },
            "faults_fired": dict(self.faults.fired),
            "disk": asdict(self.disk.stats) if self.disk is not None else None,
        }

    def cache_snapshot(self) -> dict[str, Any]:
        tiers = {
            tier.value: [self.codec.to_json(b) for b in self.cache.resident(tier)] for tier in Tier
        }
        return {"block_size": self.config.block_size, "tiers": tiers}

    async def arm_faults(self, spec: dict[str, Any]) -> dict[str, Any]:
        armed = self.faults.arm(spec)
        restart = armed.get("restart_publisher")
        if restart is not None:
            async with self._publish_lock:
                if restart["wipe_cache"]:
                    self.scheduler.kill_all()  # a restarted engine has no requests either
                    self.cache.reset()
                    self.events.take_batch()  # a restarted engine starts empty, silently
                await self.publisher.restart()
                if not restart["wipe_cache"]:
                    self.events.take_batch()  # whatever was pending is in the re-announcement
                    self.cache.announce_resident()
            if not restart["wipe_cache"]:
                await self._publish_pending()
        return armed


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
