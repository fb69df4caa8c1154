"""Fuzzed KV event frames through the live subscriber path (real ZMQ, real replay).

A bounded version of `kvgate bench fuzz` (which sends 100 000 frames per pod): mutated
and random frames mixed with valid batches; no crash, each pod's index equal to what its
valid batches alone say, every undecodable frame counted per reason — directly, and as a
real gateway reports it on /metrics and /admin/index.
"""

from __future__ import annotations

import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from bench.decoder_fuzz import load_golden_payloads
from bench.frame_fuzz import FakeEngine, fuzz_pod, run_live_fuzz
from indexer import Tier
from subscriber import DEFAULT_LIMITS
from tests.gateway.conftest import MODEL
from tests.reliability.conftest import ServeGateway

FRAMES = 2500


async def test_fuzzed_frames_change_nothing_but_what_valid_batches_say() -> None:
    outcomes = await run_live_fuzz(frames=FRAMES, pods=2, seed=7, chunk=250)
    for outcome in outcomes:
        assert outcome.crashed is None, outcome.crashed
        assert outcome.frames == FRAMES
        assert outcome.index_equal, f"{outcome.pod}: index differs from the valid-only truth"
        assert outcome.index_blocks > 0
        assert outcome.rejected_by_reason == dict(outcome.rejected_expected)
        assert sum(outcome.rejected_by_reason.values()) > FRAMES // 5
        assert len(outcome.rejected_by_reason) >= 4, (
            outcome.rejected_by_reason
        )  # several kinds of bad frame
        kinds = outcome.fuzz_by_outcome
        # decodable impostors of each seq class were sent and settled
        assert kinds["decodable_next"] and kinds["decodable_stale"] and kinds["decodable_random"]
    # fuzzing one pod never touched the other: different truths, both matched
    assert outcomes[0].truth != outcomes[1].truth


async def test_a_gateway_counts_fuzzed_frames_and_indexes_only_valid_batches(
    serve_gateway: ServeGateway,
) -> None:
    context = zmq.asyncio.Context()
    engine = FakeEngine(context, buffer=10_000)
    try:
        gw = await serve_gateway(
            1,
            pods=[{"name": "fz", "url": "http://127.0.0.1:9", "model": MODEL,
                   "events": engine.events, "replay": engine.replay}],
        )  # fmt: skip
        state = gw.state
        assert state.subscribers is not None
        outcome = await fuzz_pod(
            state.subscribers,
            engine,
            "fz",
            subscribe=False,  # the gateway's discovery subscribed it
            frames=800,
            seed=3,
            valid_share=0.5,
            chunk=200,
            golden=load_golden_payloads(),
            index_config=state.settings.index,
            table=state.table,
            limits=DEFAULT_LIMITS,  # the gateway's subscribers use the default limits
        )
        assert outcome.crashed is None, outcome.crashed
        assert outcome.index_equal
        async with gw.admin() as client:
            index = (await client.get("/admin/index?pod=fz")).json()
            page = (await client.get("/metrics")).text
    finally:
        await engine.close()
        context.destroy(linger=0)
    want = {tier.name: sorted(outcome.truth[tier]) for tier in (Tier.GPU, Tier.CPU)}
    assert {tier: index["engine_hashes"][tier] for tier in want} == want
    exported: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        if family.name == "kvgate_subscriber_rejected_frames":
            for sample in family.samples:
                if sample.labels.get("pod") == "fz" and sample.name.endswith("_total"):
                    exported[sample.labels["reason"]] = sample.value
    # every reason is exported from 0; the ones the fuzzer expects moved by exactly that much
    expected = {reason: float(n) for reason, n in outcome.rejected_expected.items()}
    assert exported == {reason: expected.get(reason, 0.0) for reason in exported}
    assert expected.keys() <= exported.keys()
