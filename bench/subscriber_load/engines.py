"""The simulated engines: one child process each (multiprocessing, spawn), publishing the
batches of its `Workload` with the simulator's `EventPublisher`, driven over a pipe."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import zmq.asyncio

from bench.subscriber_load.workload import MODEL, TOPIC, PublisherSpec, Workload
from simulator.publisher import EventPublisher
from subscriber import PodEndpoint

CATCH_UP_TIMEOUT_S = 120.0


@dataclass(slots=True)
class _Sent:
    """What an engine published: batches, events and block hashes (stored + removed)."""

    batches: int = 0
    events: int = 0
    blocks: int = 0

    def add(self, events: int, blocks: int) -> None:
        self.batches += 1
        self.events += events
        self.blocks += blocks

    def copy(self) -> _Sent:
        return _Sent(self.batches, self.events, self.blocks)

    def since(self, before: _Sent) -> dict[str, int]:
        return {
            "batches": self.batches - before.batches,
            "events": self.events - before.events,
            "blocks": self.blocks - before.blocks,
        }


class _Engine:
    """One child's command handler.

    - `live S`: step the cache and publish each batch at once, as fast as possible, S seconds;
    - `prepare N`: step the cache N times, keeping the encoded batches (nothing is sent);
    - `burst`: send every prepared batch back to back;
    - `gap K`: K batches dropped from PUB (still in the replay buffer), then one sent;
    - `resident`: the last seq and the hashes the cache holds.
    """

    def __init__(self, workload: Workload, publisher: EventPublisher) -> None:
        self._workload = workload
        self._publisher = publisher
        self._sent = _Sent()
        self._pool: list[tuple[bytes, int, int]] = []

    async def handle(self, command: tuple[Any, ...]) -> dict[str, Any]:
        name, *params = command
        if name == "live":
            return await self._live(float(params[0]))
        if name == "prepare":
            return self._prepare(int(params[0]))
        if name == "burst":
            return await self._burst()
        if name == "gap":
            return await self._gap(int(params[0]))
        if name == "resident":
            return {"last_seq": self._publisher.next_seq - 1, "resident": self._workload.resident()}
        raise ValueError(f"unknown command {command!r}")

    async def _send(self, payload: bytes, events: int, blocks: int, *, drop: bool = False) -> int:
        seq = await self._publisher.publish(payload, drop=drop)
        self._sent.add(events, blocks)
        return seq

    async def _live(self, seconds: float) -> dict[str, Any]:
        before = self._sent.copy()
        started = time.monotonic()
        deadline = started + seconds
        while time.monotonic() < deadline:
            await self._send(*self._workload.step())
            await asyncio.sleep(0)  # the replay ROUTER answers meanwhile
        return self._report(before, started)

    def _prepare(self, batches: int) -> dict[str, Any]:
        started = time.process_time()
        self._pool = [self._workload.step() for _ in range(batches)]
        return {"batches": batches, "cpu_s": time.process_time() - started}

    async def _burst(self) -> dict[str, Any]:
        before = self._sent.copy()
        pool, self._pool = self._pool, []
        started = time.monotonic()
        for index, batch in enumerate(pool):
            await self._send(*batch)
            if index % 64 == 63:
                await asyncio.sleep(0)
        return self._report(before, started)

    async def _gap(self, drops: int) -> dict[str, Any]:
        for _ in range(drops):
            await self._send(*self._workload.step(), drop=True)
        batch = self._workload.step()
        sent_at = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every process
        seq = await self._send(*batch)
        return {"seq": seq, "sent_at": sent_at}

    def _report(self, before: _Sent, started: float) -> dict[str, Any]:
        return {
            **self._sent.since(before),
            "started_at": started,
            "ended_at": time.monotonic(),
            "last_seq": self._publisher.next_seq - 1,
        }


def _publisher_main(spec: PublisherSpec, conn: Connection) -> None:
    """Entry point of an engine process."""
    asyncio.run(_publisher_loop(spec, conn))


async def _publisher_loop(spec: PublisherSpec, conn: Connection) -> None:
    context = zmq.asyncio.Context()
    publisher = EventPublisher(
        context,
        events_endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        topic=TOPIC,
        buffer_size=spec.replay_buffer,
    )
    await publisher.start()
    try:
        conn.send({"events": publisher.events_endpoint, "replay": publisher.replay_endpoint})
        engine = _Engine(Workload(spec), publisher)
        while True:
            command = await _receive(conn)
            if command[0] == "stop":
                break
            conn.send(await engine.handle(command))
    finally:
        await publisher.stop()
        context.destroy(linger=0)
        conn.close()


async def _receive(conn: Connection, timeout_s: float | None = None) -> Any:
    """`conn.recv()` without blocking the event loop (replays and subscribers keep running)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not conn.poll():
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no answer from an engine process within {timeout_s} s")
        await asyncio.sleep(0.002)
    return conn.recv()


@dataclass
class EngineProcess:
    name: str
    process: BaseProcess
    conn: Connection
    endpoint: PodEndpoint

    async def ask(
        self, *command: Any, timeout_s: float | None = CATCH_UP_TIMEOUT_S
    ) -> dict[str, Any]:
        """Send a command; its answer (EOFError if the engine process died)."""
        self.conn.send(command)
        answer: dict[str, Any] = await _receive(self.conn, timeout_s)
        return answer

    def stop(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(("stop",))
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        self.conn.close()


async def spawn(specs: list[PublisherSpec]) -> list[EngineProcess]:
    context = multiprocessing.get_context("spawn")
    started: list[tuple[PublisherSpec, BaseProcess, Connection]] = []
    for spec in specs:
        parent, child = context.Pipe()
        process = context.Process(
            target=_publisher_main, args=(spec, child), name=f"kv-pub-{spec.name}", daemon=True
        )
        process.start()
        child.close()
        started.append((spec, process, parent))
    engines = []
    try:
        for spec, child_process, conn in started:
            hello = await _receive(conn, timeout_s=60)
            endpoint = PodEndpoint(
                spec.name, MODEL, events=hello["events"], replay=hello["replay"], topic=TOPIC
            )
            engines.append(EngineProcess(spec.name, child_process, conn, endpoint))
    except BaseException:
        for _, child_process, conn in started:
            child_process.terminate()
            child_process.join(timeout=5)
            conn.close()
        raise
    return engines
