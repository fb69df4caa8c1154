"""kvgate's KV-event subscriber and index against a real vLLM engine (CPU, tiny Llama).

The reference is the engine's own event stream as an independent raw SUB saw it from the
engine's start: every hash stored minus every hash removed (copies counted), emptied by
AllBlocksCleared. The index kvgate builds from the same stream must be exactly that set.
The tests share one engine and run in file order (the last one clears its cache).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest

from indexer import IndexConfig, ModelContext, SyncPrefixHashTable
from subscriber import (
    IndexSink,
    Phase,
    PodSubscriberStatus,
    SubscriberManager,
    SubscriberSettings,
)
from tests.e2e_vllm.conftest import BLOCK_SIZE, NUM_BLOCKS, RealVllm
from tests.e2e_vllm.traffic import (
    Request,
    chat,
    plain,
    send,
    send_all,
    system_prompt,
    tokenize,
    workload,
)
from tests.helpers import eventually

pytestmark = pytest.mark.e2e_vllm

QUIET_S = 1.5
"""The engine counts as idle when its PUB socket has been silent this long, counted from
the last response at the earliest: a response can come back before the events of its
last step are published (they go out on another socket, from a publisher thread)."""


@pytest.fixture
async def client(vllm: RealVllm) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=vllm.base_url, timeout=300.0) as http:
        yield http


@dataclass(slots=True)
class Gateway:
    """kvgate's side: one index fed by one subscriber manager following one pod."""

    table: SyncPrefixHashTable
    manager: SubscriberManager
    pod: str

    def status(self) -> PodSubscriberStatus:
        status = self.manager.status(self.pod)
        assert status is not None, f"{self.pod} is not subscribed"
        return status


@asynccontextmanager
async def subscribed(vllm: RealVllm, pod: str, *, live: bool = True) -> AsyncIterator[Gateway]:
    """A subscriber of `pod`, once it is live (`live`), or once its event socket is
    connected (it may still be replaying)."""
    table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK_SIZE))
    settings = SubscriberSettings(replay_timeout_s=10.0)
    async with SubscriberManager(IndexSink(table), settings=settings) as manager:
        await manager.upsert(vllm.endpoint(pod))
        gateway = Gateway(table, manager, pod)
        if live:
            await eventually(
                lambda: gateway.status().phase is Phase.LIVE, within=30, what=f"{pod} live"
            )
        else:
            await eventually(lambda: gateway.status().connected, within=30, what=f"{pod} joined")
        yield gateway


async def settle(vllm: RealVllm, *gateways: Gateway) -> None:
    """Wait until the engine is quiet and every gateway has applied its last batch.

    Call it once every response is back.
    """
    recorder = vllm.recorder
    called = time.monotonic()
    await eventually(
        lambda: min(recorder.idle_for(), time.monotonic() - called) > QUIET_S,
        within=120,
        what="engine quiet",
    )
    last = recorder.last_seq()
    for gateway in gateways:
        await _caught_up(gateway, last)


async def _caught_up(gateway: Gateway, last: int | None) -> None:
    await eventually(
        lambda: gateway.status().last_seq == last,
        within=30,
        what=f"{gateway.pod} at seq {last}",
    )


def assert_index_equals_engine(vllm: RealVllm, gateway: Gateway) -> int:
    """table.dump(pod) == stored minus removed; returns the number of resident blocks."""
    resident = vllm.recorder.resident()
    held = gateway.table.dump(gateway.pod)
    missing = resident - held
    extra = held - resident
    assert not missing and not extra, (
        f"{gateway.pod}: index has {len(held)} blocks, engine holds {len(resident)}; "
        f"missing {len(missing)} (e.g. {sorted(missing, key=str)[:3]}), "
        f"extra {len(extra)} (e.g. {sorted(extra, key=str)[:3]})"
    )
    return len(resident)


def assert_clean(gateway: Gateway, *, allow_gaps: bool = False) -> None:
    """Whole, nothing rejected or broken; no seq gap unless `allow_gaps` (a subscriber
    joining mid-traffic may see one between the replay and its first live batch, and
    repairs it by replay)."""
    status = gateway.status()
    assert status.whole, status.degraded_reason
    assert allow_gaps or status.gaps == 0
    assert status.frames_rejected == 0
    assert status.live_dropped == 0
    stats = gateway.table.stats()
    assert stats.rejected_blocks == {}, stats.rejected_blocks
    assert stats.broken_chain_events == 0
    assert stats.unknown_removals == 0


async def test_index_equals_stored_minus_removed(
    vllm: RealVllm, client: httpx.AsyncClient, e2e_report: dict[str, object]
) -> None:
    recorder = vllm.recorder
    async with subscribed(vllm, "pod-live") as gateway:
        requests = workload()
        started = time.monotonic()
        answers = await send_all(client, vllm.model, requests)
        # A prompt of exactly 10 blocks, twice: the repeat is fully cached, so vLLM
        # recomputes its last block into a second copy stored under the same hash.
        tokens = await tokenize(client, vllm.model, plain(system_prompt(30), "Copies?"))
        exact = Request(prompt=tuple(tokens[: 10 * BLOCK_SIZE]), max_tokens=1)
        answers += [await send(client, vllm.model, exact) for _ in range(2)]
        traffic_s = time.monotonic() - started
        await settle(vllm, gateway)

        recorder.check_complete()
        totals = recorder.snapshot()
        assert totals.undecodable == 0
        assert totals.removed_unknown == 0, "the engine removed a hash it never stored"
        assert totals.removed_blocks > 0, "no eviction: the traffic must overflow the cache"
        resident = assert_index_equals_engine(vllm, gateway)
        assert 0 < resident <= NUM_BLOCKS
        assert_clean(gateway)
        cached = sum(a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers)
        assert cached > 0, "shared system prompts should hit vLLM's prefix cache"

    e2e_report.update(
        {
            "(a) requests": len(answers),
            "(a) traffic (s)": round(traffic_s, 1),
            "(a) batches": totals.batches,
            "(a) BlockStored events / blocks": f"{totals.stored_events} / {totals.stored_blocks}",
            "(a) blocks stored again while held (copies)": totals.restored_blocks,
            "(a) blocks removed": totals.removed_blocks,
            "(a) engine holds (stored - removed)": resident,
            "(a) index holds": len(gateway.table.dump(gateway.pod)),
            "(a) prompt tokens served from vLLM's cache": cached,
        }
    )


async def test_late_subscriber_rebuilds_from_replay(
    vllm: RealVllm, client: httpx.AsyncClient, e2e_report: dict[str, object]
) -> None:
    recorder = vllm.recorder
    if recorder.snapshot().stored_blocks == 0:  # run alone: make some history first
        await send_all(client, vllm.model, workload(variations=2))
        await settle(vllm)
    async with subscribed(vllm, "pod-late") as gateway:
        await settle(vllm, gateway)
        status = gateway.status()
        assert status.replays >= 1
        assert status.batches_applied == recorder.snapshot().batches
        resident = assert_index_equals_engine(vllm, gateway)
        assert_clean(gateway)

        # ... and stays equal live afterwards.
        more = [chat(system_prompt(20 + i), "And now?") for i in range(3)]
        await send_all(client, vllm.model, more)
        await settle(vllm, gateway)
        assert_index_equals_engine(vllm, gateway)
        assert_clean(gateway)
    e2e_report["(b) late subscriber: replayed batches / blocks rebuilt"] = (
        f"{status.batches_applied} / {resident}"
    )


async def test_subscriber_joining_mid_traffic(
    vllm: RealVllm, client: httpx.AsyncClient, e2e_report: dict[str, object]
) -> None:
    """Replay and live batches overlap: the subscriber must merge them, each batch once.

    The subscriber joins while the first requests run; the rest are sent only once its
    event socket is connected, so it joins mid-traffic however fast the first ones end."""
    requests = [plain(system_prompt(50 + i), q) for i in range(5) for q in ("A?", "B?")]
    joined = asyncio.Event()

    async def traffic_around_the_join() -> None:
        await send_all(client, vllm.model, requests[:4], concurrency=2)
        await joined.wait()
        await send_all(client, vllm.model, requests[4:], concurrency=2)

    async with asyncio.TaskGroup() as group:
        traffic = group.create_task(traffic_around_the_join())
        await eventually(
            lambda: vllm.recorder.idle_for() < 0.5, within=30, what="traffic under way"
        )
        async with subscribed(vllm, "pod-mid", live=False) as gateway:
            at_join = vllm.recorder.last_seq()
            joined.set()
            await traffic
            await settle(vllm, gateway)
            vllm.recorder.check_complete()
            resident = assert_index_equals_engine(vllm, gateway)
            assert_clean(gateway, allow_gaps=True)
            status = gateway.status()
    assert at_join is None or (status.last_seq or 0) > at_join  # batches came after it joined
    e2e_report["(b2) joined mid-traffic: batches applied / replays / gaps / blocks"] = (
        f"{status.batches_applied} / {status.replays} / {status.gaps} / {resident}"
    )


@pytest.mark.parametrize("kind", ["plain", "chat"])
async def test_gateway_hashes_find_what_vllm_stored(
    vllm: RealVllm, client: httpx.AsyncClient, kind: str, e2e_report: dict[str, object]
) -> None:
    system = system_prompt(40 if kind == "plain" else 41)  # content the engine never saw
    make = plain if kind == "plain" else chat
    request: Request = make(system, "Which pod holds this prompt?", max_tokens=1)
    tokens = await tokenize(client, vllm.model, request)
    async with subscribed(vllm, f"pod-match-{kind}") as gateway:
        context = ModelContext(vllm.model)
        hashes = gateway.table.prefix_hashes(tokens)
        assert len(hashes) == len(tokens) // BLOCK_SIZE >= 10
        assert gateway.table.match(context, hashes, [gateway.pod]).matched(gateway.pod) == 0

        first = await send(client, vllm.model, request)
        await settle(vllm, gateway)
        assert first["usage"]["prompt_tokens"] == len(tokens)
        # vLLM stored a chain whose tokens are exactly /tokenize's, block by block...
        chain = vllm.recorder.chain_for(tokens, BLOCK_SIZE)
        assert len(chain) == len(hashes), vllm.recorder.explain_chain(tokens, BLOCK_SIZE)
        # ... and the gateway, hashing /tokenize's tokens itself, finds all of it.
        matched = gateway.table.match(context, hashes, [gateway.pod]).matched(gateway.pod)
        assert matched == len(hashes)

        # The gateway's prediction is vLLM's own hit on a repeat (it never reuses the
        # block holding the last prompt token).
        second = await send(client, vllm.model, request)
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == min(matched, (len(tokens) - 1) // BLOCK_SIZE) * BLOCK_SIZE
        await settle(vllm, gateway)
        assert_index_equals_engine(vllm, gateway)
        assert_clean(gateway)
    e2e_report[f"(c) {kind}: prompt tokens / blocks matched / vLLM cached tokens"] = (
        f"{len(tokens)} / {matched} of {len(hashes)} / {cached}"
    )


async def test_reset_prefix_cache_empties_the_index(
    vllm: RealVllm, client: httpx.AsyncClient, e2e_report: dict[str, object]
) -> None:
    recorder = vllm.recorder
    async with subscribed(vllm, "pod-reset") as gateway:
        if not gateway.table.dump(gateway.pod):
            await send_all(client, vllm.model, workload(systems=2, variations=1))
            await settle(vllm, gateway)
        held_before = len(gateway.table.dump(gateway.pod))
        assert held_before > 0
        cleared_before = recorder.snapshot().cleared

        response = await client.post("/reset_prefix_cache")
        response.raise_for_status()
        assert response.json() == {"success": True}
        # AllBlocksCleared goes out at the engine's next step: give it one that fills no
        # block (3 tokens), so the cache stays empty.
        await send(client, vllm.model, Request(prompt="hi", max_tokens=1))
        await settle(vllm, gateway)

        assert recorder.snapshot().cleared == cleared_before + 1
        assert recorder.resident() == set()
        assert gateway.table.dump(gateway.pod) == set()
        assert gateway.table.stats().engine_entries == 0
        assert_clean(gateway)

    # A subscriber that starts now replays the whole history, the clear included.
    async with subscribed(vllm, "pod-after-reset") as late:
        await settle(vllm, late)
        assert late.table.dump(late.pod) == set()
        assert late.status().whole
    e2e_report["(d) reset_prefix_cache: blocks before -> after"] = f"{held_before} -> 0"
