"""The simulated engines: one child process each, publishing the batches of its `Workload`
with the simulator's `EventPublisher`, driven by JSON lines over its stdin and stdout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import zmq.asyncio

from bench.harness.processes import ChildProcess
from bench.subscriber_load.workload import MODEL, TOPIC, PublisherSpec, Workload
from simulator.publisher import EventPublisher
from subscriber import PodEndpoint

CATCH_UP_TIMEOUT_S = 120.0


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
        self._sent: Counter[str] = Counter()  # batches, events, block hashes published
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
        self._sent.update(batches=1, events=events, blocks=blocks)
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

    def _report(self, before: Counter[str], started: float) -> dict[str, Any]:
        return {
            **{key: self._sent[key] - before[key] for key in ("batches", "events", "blocks")},
            "started_at": started,
            "ended_at": time.monotonic(),
            "last_seq": self._publisher.next_seq - 1,
        }


async def _publisher_loop(spec: PublisherSpec) -> None:
    """An engine process: its endpoints as the first line on stdout, then one JSON answer
    line per JSON command line on stdin, until `stop` or the end of stdin."""
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
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
        _answer({"events": publisher.events_endpoint, "replay": publisher.replay_endpoint})
        engine = _Engine(Workload(spec), publisher)
        while (line := await commands.readline()) and (command := json.loads(line))[0] != "stop":
            _answer(await engine.handle(tuple(command)))
    finally:
        await publisher.stop()
        context.destroy(linger=0)


def _answer(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


class EngineProcess(ChildProcess):
    """One engine process (`python -m bench.subscriber_load.engines SPEC`), driven by
    commands (see `_Engine`) over its stdin and stdout."""

    def __init__(self, spec: PublisherSpec, log_path: Path) -> None:
        super().__init__(spec.name, log_path)
        self.spec = spec
        self.endpoint = PodEndpoint(spec.name, MODEL, events="", topic=TOPIC)

    async def start(self, timeout_s: float = 60.0) -> None:
        module = [sys.executable, "-m", "bench.subscriber_load.engines"]
        await self.spawn([*module, json.dumps(asdict(self.spec))], pipe=True, stdin=True)
        hello = await self._read(timeout_s)
        self.endpoint = replace(self.endpoint, events=hello["events"], replay=hello["replay"])

    async def ask(
        self, *command: Any, timeout_s: float | None = CATCH_UP_TIMEOUT_S
    ) -> dict[str, Any]:
        """Send a command; its answer (EOFError if the engine process died)."""
        await self.write_line(json.dumps(command))
        return await self._read(timeout_s)

    async def _read(self, timeout_s: float | None) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(self.readline(), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"no answer from an engine process within {timeout_s} s") from None
        if not line:
            raise EOFError(f"the engine process {self.name} exited: {self.log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def stop(self, grace_s: float = 5.0, sig: int | None = None) -> None:
        """Ask the engine to stop, then end it (it is signalled after `grace_s`)."""
        if self.proc is not None:
            with contextlib.suppress(OSError, TimeoutError):
                await self.write_line(json.dumps(["stop"]))
                await asyncio.wait_for(self.proc.wait(), grace_s)
        await super().stop(grace_s, sig)


async def spawn(specs: list[PublisherSpec], log_path: Path) -> list[EngineProcess]:
    engines = [EngineProcess(spec, log_path) for spec in specs]
    try:
        await asyncio.gather(*(engine.start() for engine in engines))
    except BaseException:
        await asyncio.gather(*(engine.stop() for engine in engines))
        raise
    return engines


if __name__ == "__main__":
    asyncio.run(_publisher_loop(PublisherSpec(**json.loads(sys.argv[1]))))
