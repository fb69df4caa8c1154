"""Live KV event fuzzing (`kvgate bench fuzz`): mutated and random frames through the real
subscriber path. Set-up, guarantees and figures: docs/reliability.md.

Per pod a `FakeEngine` (ZMQ PUB + replay ROUTER) mixes valid batches with fuzz frames
(`decoder_fuzz.MUTATORS`) whose seq is the next one, a stale one or a random one; a
`SubscriberManager` feeding a `SyncPrefixHashTable` through `IndexSink` subscribes. At the
end each pod's index must equal the one built from the valid batches alone, and the
rejection counters the undecodable frames sent, per reason. The stream resets the
engine's cache more often than the buffer wraps, so a rebuild after an impostor batch is
always exact; frames go out in chunks ending with a valid batch that is awaited, so none
is lost to a high-water mark (the counts would be unverifiable).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import random
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import zmq
import zmq.asyncio

from bench import decoder_fuzz
from bench.harness.readiness import subscriber_live, until
from bench.results_io import add_output_arguments, print_table, write_json
from indexer import IndexConfig, SyncPrefixHashTable, Tier
from subscriber import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    IndexSink,
    KVEventBatch,
    Phase,
    PodEndpoint,
    RejectCounter,
    SubscriberManager,
    SubscriberSettings,
    decode_batch,
    decode_pub_message,
    decode_replay_request,
    encode_batch,
    encode_replay_end,
    encode_replay_entry,
)

MODEL = "fuzz-model"
MAX_SEQ = 2**64 - 2
SEQ_CLASSES = ("next", "stale", "random")


class ModelEngine:
    """A valid KV event stream: chains stored, blocks removed one hash per event (as vLLM
    does), and a prefix-cache reset every `reset_every` batches."""

    def __init__(self, rng: random.Random, *, block_size: int = 16, reset_every: int = 1500):
        self._rng = rng
        self._block_size = block_size
        self._reset_every = reset_every
        self._resident: list[int] = []
        self._batches = 0

    def next_batch(self) -> KVEventBatch:
        rng = self._rng
        self._batches += 1
        events: list[Any] = []
        if self._batches % self._reset_every == 0:
            self._resident.clear()
            events.append(AllBlocksCleared())
        elif self._resident and (rng.random() < 0.4 or len(self._resident) > 400):
            for _ in range(min(len(self._resident), rng.randint(1, 6))):
                gone = self._resident.pop(rng.randrange(len(self._resident)))
                events.append(BlockRemoved((gone,), medium="GPU"))
        else:
            count = rng.randint(1, 4)
            hashes = tuple(rng.getrandbits(64) for _ in range(count))
            parent = rng.choice(self._resident) if self._resident and rng.random() < 0.5 else None
            tokens = tuple(rng.randrange(50_000) for _ in range(count * self._block_size))
            events.append(BlockStored(hashes, parent, tokens, self._block_size, medium="GPU"))
            self._resident.extend(hashes)
        return KVEventBatch(ts=time.time(), events=tuple(events))


class FakeEngine:
    """A PUB socket and a replay ROUTER speaking vLLM's protocol, sending what it is told."""

    def __init__(self, context: zmq.asyncio.Context, *, buffer: int) -> None:
        self._pub = context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 0)  # never drop: every frame must be accounted for
        self._pub.bind("tcp://127.0.0.1:*")
        self._router = context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind("tcp://127.0.0.1:*")
        self.events = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.history: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.next_seq = 0
        self.replay_requests = 0
        self._task = asyncio.create_task(self._serve_replay(), name="fuzz-replay")

    async def send_valid(self, payload: bytes) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.history.append((seq, payload))  # replayable before it is even sent, as vLLM
        await self._pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        return seq

    async def send_frames(self, frames: Sequence[bytes]) -> None:
        await self._pub.send_multipart(list(frames))

    async def _serve_replay(self) -> None:
        while True:
            identity, *request = await self._router.recv_multipart()
            try:
                start = decode_replay_request(request)
            except DecodeError:
                continue
            self.replay_requests += 1
            for seq, payload in list(self.history):
                if seq >= start:
                    await self._router.send_multipart(
                        [identity, *encode_replay_entry(seq, payload)]
                    )
            await self._router.send_multipart([identity, *encode_replay_end()])

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._pub.close(linger=0)
        self._router.close(linger=0)


@dataclass
class PodOutcome:
    """Its fields but `truth` are the pod's JSON figures, in their order."""

    pod: str
    frames: int = 0
    valid: int = 0
    crashed: str | None = None
    index_equal: bool = False
    index_blocks: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    rejected_expected: Counter[str] = field(default_factory=Counter)
    fuzz_by_outcome: Counter[str] = field(default_factory=Counter)
    restarts_detected: int = 0
    replays: int = 0
    truth: dict[Tier, set[Any]] = field(default_factory=dict)
    """What the valid batches alone say the pod holds, per tier."""


def classify(frames: Sequence[bytes], limits: Any) -> str | None:
    """The reject reason the subscriber must count for `frames`, or None if it decodes."""
    try:
        _, _, payload = decode_pub_message(frames)
        decode_batch(payload, limits=limits)
    except DecodeError as exc:
        return exc.reason
    return None


def fuzz_frames(
    rng: random.Random, pool: Sequence[bytes], next_seq: int
) -> tuple[list[bytes], str]:
    """One fuzz message and the seq class it carries ("frames" for a malformed message)."""
    _, mutate = rng.choice(decoder_fuzz.MUTATORS)  # the decoder fuzzer's own mutations
    data = mutate(rng, pool)
    if isinstance(data, list):
        return (data or [b""]), "frames"
    seq_class = rng.choice(SEQ_CLASSES)
    if seq_class == "next":
        seq = next_seq
    elif seq_class == "stale" and next_seq > 0:
        seq = rng.randrange(next_seq)
    else:
        seq_class, seq = "random", rng.randint(0, MAX_SEQ)
    return [b"", seq.to_bytes(8, "big"), data], seq_class


async def fuzz_pod(
    manager: SubscriberManager,
    engine: FakeEngine,
    name: str,
    *,
    subscribe: bool = True,
    frames: int,
    seed: int,
    valid_share: float,
    chunk: int,
    golden: Sequence[bytes],
    index_config: IndexConfig,
    table: SyncPrefixHashTable,
    limits: Any,
) -> PodOutcome:
    """Send `frames` frames from `engine` to the subscriber of pod `name` (subscribed here
    unless `subscribe` is false: someone else, such as a gateway's discovery, does)."""
    rng = random.Random(seed)
    outcome = PodOutcome(name)
    truth = SyncPrefixHashTable(index_config)
    truth_sink = IndexSink(truth)
    truth_sink.register(name, MODEL, {})
    model = ModelEngine(rng)
    recent: deque[bytes] = deque(golden, maxlen=64)
    try:
        if subscribe:
            await manager.upsert(PodEndpoint(name, MODEL, engine.events, engine.replay))
        live = functools.partial(subscriber_live, manager, name)
        await until(live, f"{name} live and connected", 60.0, 0.002)
        pending_golden = list(golden)
        sent_in_chunk = 0
        while outcome.frames < frames:
            last_chunk_frame = sent_in_chunk >= chunk - 1 or outcome.frames == frames - 1
            if last_chunk_frame or rng.random() < valid_share:
                if pending_golden:
                    payload = pending_golden.pop(0)
                else:
                    payload = encode_batch(model.next_batch(), rng.choice(("map", "array")))
                truth_sink.apply(name, decode_batch(payload))
                last_valid = await engine.send_valid(payload)
                recent.append(payload)
                outcome.valid += 1
            else:
                message, seq_class = fuzz_frames(rng, recent, engine.next_seq)
                reason = classify(message, limits)
                if reason is None:
                    outcome.fuzz_by_outcome[f"decodable_{seq_class}"] += 1
                else:
                    outcome.rejected_expected[reason] += 1
                    outcome.fuzz_by_outcome["rejected"] += 1
                await engine.send_frames(message)
            outcome.frames += 1
            sent_in_chunk += 1
            if last_chunk_frame:
                sent_in_chunk = 0
                rejects = outcome.rejected_expected.total()
                caught_up = functools.partial(_caught_up, manager, name, last_valid, rejects)
                await until(caught_up, f"{name} caught up with seq {last_valid}", 60.0, 0.002)
        status = manager.status(name)
        assert status is not None
        outcome.rejected_by_reason = {
            r: n for (p, r), n in manager.rejects.snapshot().items() if p == name
        }
        outcome.restarts_detected = status.restarts
        outcome.replays = status.replays
        got, want = table.dump_tiers(name), truth.dump_tiers(name)
        outcome.index_equal = got == want and status.whole
        outcome.truth = want
        outcome.index_blocks = sum(len(want[tier]) for tier in (Tier.GPU, Tier.CPU))
    except Exception as exc:  # a crash is a result to report, not a reason to stop the others
        outcome.crashed = repr(exc)
    return outcome


def _caught_up(manager: SubscriberManager, name: str, seq: int, rejects: int) -> bool:
    status = manager.status(name)
    if status is None or status.phase is Phase.BACKOFF:
        raise RuntimeError(f"the subscriber of {name} stopped (phase {status and status.phase})")
    return status.last_seq == seq and status.frames_rejected >= rejects


async def run_live_fuzz(
    *,
    frames: int,
    pods: int = 1,
    seed: int = 1,
    valid_share: float = 0.5,
    buffer: int = 10_000,
    chunk: int = 500,
) -> list[PodOutcome]:
    """Fuzz `pods` pods at once with `frames` frames each; one outcome per pod."""
    golden = decoder_fuzz.load_golden_payloads()
    index_config = IndexConfig()
    table = SyncPrefixHashTable(index_config)
    settings = SubscriberSettings(idle_probe_s=30.0)
    context = zmq.asyncio.Context()
    engines = [FakeEngine(context, buffer=buffer) for _ in range(pods)]
    try:
        async with SubscriberManager(
            IndexSink(table),
            settings=settings,
            rejects=RejectCounter(),
            context=context,
            rng=random.Random(seed),
        ) as manager:
            return list(
                await asyncio.gather(
                    *(
                        fuzz_pod(
                            manager,
                            engine,
                            f"pod-{i}",
                            frames=frames,
                            seed=seed * 1000 + i,
                            valid_share=valid_share,
                            chunk=chunk,
                            golden=golden,
                            index_config=index_config,
                            table=table,
                            limits=settings.decode_limits,
                        )
                        for i, engine in enumerate(engines)
                    )
                )
            )
    finally:
        for engine in engines:
            await engine.close()
        context.destroy(linger=0)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--frames", type=int, default=100_000, help="frames per pod (100000)")
    parser.add_argument("--pods", type=int, default=2, help="pods fuzzed at once (2)")
    parser.add_argument("--seed", type=int, default=1, help="seed (1)")
    parser.add_argument(
        "--valid-share", type=float, default=0.5, help="share of valid batches (0.5)"
    )
    parser.add_argument(
        "--buffer", type=int, default=10_000, help="engine replay buffer, batches (10000)"
    )
    add_output_arguments(parser, "frame_fuzz", plot=False)


def run(args: argparse.Namespace) -> int:
    print(f"live frame fuzz: {args.pods} pods x {args.frames} frames, seed {args.seed}...")
    started = time.perf_counter()
    outcomes = asyncio.run(
        run_live_fuzz(
            frames=args.frames,
            pods=args.pods,
            seed=args.seed,
            valid_share=args.valid_share,
            buffer=args.buffer,
        )
    )
    seconds = time.perf_counter() - started
    failed = False
    rows: list[tuple[str, str, str]] = []
    per_pod = []
    for o in outcomes:
        rejected, expected = o.rejected_by_reason, o.rejected_expected
        counted = rejected == dict(expected)
        ok = o.crashed is None and o.index_equal and counted
        failed |= not ok
        rows += [
            (f"{o.pod}: frames", f"{o.frames:,}", f"{o.valid:,} valid"),
            (f"{o.pod}: crashes", "0" if o.crashed is None else "1", o.crashed or "must be 0"),
            (f"{o.pod}: index = truth", str(o.index_equal), f"{o.index_blocks:,} blocks"),
            (f"{o.pod}: rejections counted", f"{sum(rejected.values()):,}",
             f"expected {sum(expected.values()):,}: {'ok' if counted else 'MISMATCH'}"),
            *((f"{o.pod}: fuzz {k}", f"{n:,}", "") for k, n in sorted(o.fuzz_by_outcome.items())),
            (f"{o.pod}: engine-restart rebuilds", f"{o.restarts_detected:,}",
             "impostors found by digest"),
            (f"{o.pod}: replays", f"{o.replays:,}", ""),
        ]  # fmt: skip
        per_pod.append({f.name: getattr(o, f.name) for f in fields(o) if f.name != "truth"})
    total = sum(o.frames for o in outcomes)
    rows.append(("frames/s (all pods)", f"{total / seconds:,.0f}", f"{seconds:.1f} s"))
    print_table("KV events: live frame fuzz through the subscriber", rows)
    write_json(
        args.json,
        {
            "config": {"frames_per_pod": args.frames, "pods": args.pods, "seed": args.seed,
                       "valid_share": args.valid_share, "buffer": args.buffer},
            "frames_per_pod": args.frames,
            "crashes": sum(o.crashed is not None for o in outcomes),
            "index_equal": all(o.index_equal for o in outcomes),
            "seconds": seconds,
            "frames_per_s": total / seconds,
            "pods": per_pod,
        },
    )  # fmt: skip
    print(f"JSON written to {args.json}")
    return 1 if failed else 0
