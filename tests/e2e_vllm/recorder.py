"""An independent reference for what an engine holds: a raw SUB that counts every event.

It shares nothing with kvgate's subscriber but the frame and payload decoders: a plain
blocking ZMQ SUB in a thread, no replay, no index. For each (medium, engine hash) it keeps
stores minus removals (counting copies: the same hash can be stored twice and removed
once); AllBlocksCleared empties it. Started before any traffic, it must see every batch
from seq 0 on, without a hole — `check_complete` says so.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import zmq

from subscriber import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EngineHash,
    KVEvent,
    decode_batch,
    decode_pub_message,
)


@dataclass(slots=True)
class RecorderTotals:
    batches: int = 0
    stored_events: int = 0
    stored_blocks: int = 0
    restored_blocks: int = 0
    """Stores of a hash already held: a second copy (vLLM recomputes a fully cached
    prompt's last block into a new block with the same hash)."""
    removed_blocks: int = 0
    cleared: int = 0
    removed_unknown: int = 0
    """BlockRemoved of a hash the recorder did not count as held (should stay 0)."""
    undecodable: int = 0
    token_blocks: dict[EngineHash, tuple[int, ...]] = field(default_factory=dict)
    """Engine hash -> the token ids of that block, as last stored."""
    parents: dict[EngineHash, EngineHash | None] = field(default_factory=dict)
    """Engine hash -> its parent's hash (None at the root), as last stored."""


class RawEventRecorder:
    """Records a PUB endpoint's KV events in a background thread until `close()`."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        self.endpoint = endpoint
        self._context = zmq.Context()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 0)  # never drop: the reference must be complete
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._monitor = self._sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._lock = threading.Lock()
        self._held: Counter[tuple[str, EngineHash]] = Counter()
        self._seqs: list[int] = []
        self.totals = RecorderTotals()
        self.last_message_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-recorder", daemon=True)

    def start(self, connect_timeout_s: float = 10.0) -> None:
        """Connect and wait for the ZMTP handshake with the publisher: the SUB sends its
        subscription as the first message after it, and a PUB reads its pipes before each
        send, so a batch published after traffic starts reaches us. `check_complete` says
        so afterwards (vLLM's PUB is not an XPUB: it cannot tell us it saw the SUBSCRIBE)."""
        self._sub.connect(self.endpoint)
        if not self._monitor.poll(int(connect_timeout_s * 1000)):
            raise TimeoutError(f"raw recorder could not connect to {self.endpoint}")
        self._monitor.recv_multipart()
        self._sub.disable_monitor()
        self._monitor.close(linger=0)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if not self._monitor.closed:
            self._monitor.close(linger=0)
        self._sub.close(linger=0)
        self._context.term()

    # -- what was seen ------------------------------------------------------------------

    def resident(self) -> set[EngineHash]:
        """Engine hashes stored and not (fully) removed since the last AllBlocksCleared."""
        with self._lock:
            return {engine_hash for (_, engine_hash), n in self._held.items() if n > 0}

    def last_seq(self) -> int | None:
        with self._lock:
            return self._seqs[-1] if self._seqs else None

    def chain_for(self, token_ids: list[int], block_size: int) -> list[EngineHash]:
        """The resident engine blocks holding `token_ids` from the root, block by block,
        found through the stored parents and token ids alone (no hashing)."""
        resident = self.resident()
        totals = self.snapshot()
        chain: list[EngineHash] = []
        parent: EngineHash | None = None
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            want = tuple(token_ids[start : start + block_size])
            found = [
                h
                for h in resident
                if totals.parents.get(h) == parent and totals.token_blocks.get(h) == want
            ]
            if not found:
                break
            parent = found[0]
            chain.append(parent)
        return chain

    def explain_chain(self, token_ids: list[int], block_size: int) -> str:
        """Where `chain_for` stops, for an assertion message."""
        chain = self.chain_for(token_ids, block_size)
        start = len(chain) * block_size
        want = tuple(token_ids[start : start + block_size])
        totals = self.snapshot()
        resident = self.resident()
        same = [
            (h, totals.parents.get(h), h in resident)
            for h, tokens in totals.token_blocks.items()
            if tokens == want
        ]
        return (
            f"chain stops after {len(chain)} blocks; blocks ever stored with the next "
            f"block's tokens (hash, parent, resident): {same}; chain: {chain}"
        )

    def idle_for(self) -> float:
        return time.monotonic() - self.last_message_at

    def check_complete(self) -> None:
        """Every batch since the engine started was seen, in order, exactly once."""
        with self._lock:
            seqs = list(self._seqs)
        assert seqs == list(range(len(seqs))), f"recorder missed batches: seqs {seqs[:20]}..."

    def snapshot(self) -> RecorderTotals:
        with self._lock:
            t = self.totals
            return replace(t, token_blocks=dict(t.token_blocks), parents=dict(t.parents))

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            frames = self._sub.recv_multipart()
            self.last_message_at = time.monotonic()
            try:
                _topic, seq, payload = decode_pub_message(frames)
                events = decode_batch(payload).events
            except DecodeError:
                with self._lock:
                    self.totals.undecodable += 1
                continue
            with self._lock:
                self._seqs.append(seq)
                self._record(events)

    def _record(self, events: Iterable[KVEvent]) -> None:
        totals = self.totals
        totals.batches += 1
        held = self._held
        for event in events:
            if isinstance(event, BlockStored):
                totals.stored_events += 1
                totals.stored_blocks += len(event.block_hashes)
                medium = event.medium or "GPU"
                size = event.block_size
                parent = event.parent_block_hash
                for i, engine_hash in enumerate(event.block_hashes):
                    if held[(medium, engine_hash)] > 0:
                        totals.restored_blocks += 1
                    held[(medium, engine_hash)] += 1
                    totals.token_blocks[engine_hash] = tuple(
                        event.token_ids[i * size : (i + 1) * size]
                    )
                    totals.parents[engine_hash] = parent
                    parent = engine_hash
            elif isinstance(event, BlockRemoved):
                medium = event.medium or "GPU"
                for engine_hash in event.block_hashes:
                    totals.removed_blocks += 1
                    key = (medium, engine_hash)
                    if held[key] <= 0:
                        totals.removed_unknown += 1
                        continue
                    held[key] -= 1
                    if held[key] == 0:
                        del held[key]
            elif isinstance(event, AllBlocksCleared):
                totals.cleared += 1
                held.clear()
