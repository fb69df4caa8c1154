"""One `PodSubscriber` per pod that publishes KV events, following discovery."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import zmq.asyncio

from subscriber.client import PodSubscriber
from subscriber.rejects import RejectCounter
from subscriber.sink import BatchSink
from subscriber.status import PodEndpoint, PodSubscriberStatus, ResumePoint, SubscriberSettings
from subscriber.zap import ZapGuard

ResumeHook = Callable[[PodEndpoint], ResumePoint | None]
"""Called when a pod's subscriber starts, after the pod is registered in the sink: it may
put a saved index for the pod into the sink and say where it stands."""

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Running:
    subscriber: PodSubscriber
    task: asyncio.Task[None]


class SubscriberManager:
    """Starts, restarts and stops pod subscribers as discovery reports pods.

    An async context manager owned by the application lifespan: leaving it stops every
    subscriber and closes every socket. `upsert` with the same endpoint is a no-op; with a
    changed one (new address, topic, model) the pod's subscriber is restarted from a
    clean slate. `remove` stops it and drops the pod from the index. A `resume` hook lets
    a new subscriber start from a restored index instead of an empty one.
    """

    def __init__(
        self,
        sink: BatchSink,
        *,
        settings: SubscriberSettings | None = None,
        rejects: RejectCounter | None = None,
        context: zmq.asyncio.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        resume: ResumeHook | None = None,
    ) -> None:
        self._sink = sink
        self._resume = resume
        self._settings = settings or SubscriberSettings()
        self.rejects = rejects or RejectCounter(clock=clock)
        self._owns_context = context is None
        self._context = context or zmq.asyncio.Context()
        self._clock = clock
        self._rng = rng or random.Random()
        self._running: dict[str, _Running] = {}
        self._zap = ZapGuard(self._context)
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def upsert(self, endpoint: PodEndpoint) -> None:
        """Start subscribing to a pod, or restart if its endpoint changed."""
        if self._closed:
            raise RuntimeError("the subscriber manager is closed")
        running = self._running.get(endpoint.name)
        if running is not None:
            if running.subscriber.endpoint == endpoint:
                return
            await self._stop(endpoint.name)
        self._sink.register(endpoint.name, endpoint.model, endpoint.lora_names)
        if endpoint.bind and endpoint.allowed_peers:
            self._zap.allow(endpoint.name, endpoint.allowed_peers)
        subscriber = PodSubscriber(
            endpoint,
            context=self._context,
            sink=self._sink,
            rejects=self.rejects,
            settings=self._settings,
            clock=self._clock,
            rng=random.Random(self._rng.random()),
            resume=self._resume(endpoint) if self._resume is not None else None,
        )
        task = asyncio.create_task(subscriber.run(), name=f"kv-subscriber-{endpoint.name}")
        self._running[endpoint.name] = _Running(subscriber, task)
        logger.info("kv events: subscribed to %s at %s", endpoint.name, endpoint.events)

    async def remove(self, name: str) -> None:
        """Stop subscribing to a pod and forget what it held."""
        if name in self._running:
            await self._stop(name)
            self._sink.unregister(name)
            self.rejects.forget(name)
            self._zap.forget(name)
            logger.info("kv events: unsubscribed from %s", name)

    def pods(self) -> list[str]:
        return list(self._running)

    def status(self, name: str) -> PodSubscriberStatus | None:
        running = self._running.get(name)
        if running is None:
            return None
        status = running.subscriber.status()
        refused = self._zap.refused.get(name, 0)
        return dataclasses.replace(status, refused_peers=refused) if refused else status

    def resume_point(self, name: str) -> tuple[PodEndpoint, ResumePoint] | None:
        """The pod's endpoint and where its index stands, if it stands anywhere now."""
        running = self._running.get(name)
        point = running.subscriber.resume_point() if running else None
        return None if running is None or point is None else (running.subscriber.endpoint, point)

    def statuses(self) -> dict[str, PodSubscriberStatus]:
        return {name: r.subscriber.status() for name, r in self._running.items()}

    async def close(self) -> None:
        """Stop every subscriber (their index entries stay) and close the ZMQ context."""
        if self._closed:
            return
        self._closed = True
        for name in list(self._running):
            await self._stop(name)
        await self._zap.close()
        if self._owns_context:
            self._context.destroy(linger=0)

    async def _stop(self, name: str) -> None:
        running = self._running.pop(name)
        # Wait without swallowing our own caller's cancellation, and cancel again if the
        # task lived on (a cancellation lost in a race must not hang shutdown).
        running.task.cancel()
        await asyncio.wait({running.task}, timeout=1.0)
        while not running.task.done():
            logger.warning("kv events of %s: subscriber ignored a cancel; cancelling again", name)
            running.task.cancel()
            await asyncio.wait({running.task}, timeout=1.0)
        if not running.task.cancelled() and running.task.exception() is not None:
            logger.error("kv events of %s: subscriber ended with %r", name,
                         running.task.exception())  # fmt: skip
