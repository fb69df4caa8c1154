"""A deterministic replay of the default routing policy: a fixed-seed stream of requests
(new conversations sharing system prompts, their later turns, unique and long prompts,
TTFT and TPOT objectives, unstreamed answers), their first bytes, relayed chunks, scrapes
and ends, over a fleet of pods whose true speeds differ, on an injected clock. Every
decision's ranking and the chosen pod's predicted terms are recorded: a change of the
routing core that keeps its decisions keeps this record bit for bit
(`tests/gateway/test_routing_golden.py`).

    python -m tests.gateway.routing_replay --write   # re-record the golden (on purpose)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.control.discovery import Pod
from gateway.control.registry import PodRegistry
from gateway.errors import SloUnreachable
from gateway.routing import RoutingRequest
from gateway.routing.metrics import RouterMetrics
from gateway.routing.routed import Routed
from gateway.routing.router import Router, build_policies
from gateway.settings import Settings
from indexer import IndexConfig, ModelContext, SyncPrefixHashTable
from predictor import Predictor

MODEL = "replay-model"
BLOCK = 16
GOLDEN = Path(__file__).with_name("data") / "routing_golden.json"
SCENARIOS = {"16-pods": (16, 1, False), "64-pods": (64, 2, False), "16-pods-shed": (16, 3, True)}
"""name: (pods, seed, KVGATE_SLO_SHED)"""
DECISIONS = 700


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class _Stored:
    """A BlockStored event as the subscriber's decoder yields it."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int = BLOCK
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = "GPU"


@dataclass(slots=True)
class Record:
    rankings: list[list[int]] = field(default_factory=list)
    terms: list[dict[str, float]] = field(default_factory=list)
    shed: int = 0

    def summary(self) -> dict[str, Any]:
        picks = [ranking[0] for ranking in self.rankings]
        digest = hashlib.sha256(json.dumps([self.rankings, self.terms]).encode()).hexdigest()
        return {"picks": picks, "shed": self.shed, "digest": digest,
                "first_terms": self.terms[:20]}  # fmt: skip


async def replay(pods: int, seed: int, shed: bool, decisions: int = DECISIONS) -> Record:
    rng = random.Random(seed)
    clock = Clock()
    settings = Settings(index=IndexConfig(block_size=BLOCK), slo_shed=shed)
    table = SyncPrefixHashTable(settings.index, clock=clock)
    registry = PodRegistry(table=table, subscribers=None)
    names = [f"pod-{i:02d}" for i in range(pods)]
    for name in names:
        await registry.upsert_pod(Pod(name=name, url=f"http://{name}:8000", model=MODEL))
        table.register_pod(name, MODEL, publishes_events=True)
    slowness = {name: rng.choice((0.7, 1.0, 1.0, 1.6)) for name in names}
    systems = [[rng.randrange(1, 50_000) for _ in range(rng.choice((480, 1024, 2048)))]
               for _ in range(6)]  # fmt: skip
    engine_hash = 1
    for number, system in enumerate(systems[:4]):
        for name in rng.sample(names, max(1, pods // 4)):
            parent = None
            medium = "CPU" if number == 3 else "GPU"
            for start in range(0, len(system) - BLOCK + 1, BLOCK):
                stored = _Stored([engine_hash], parent, system[start : start + BLOCK],
                                 medium=medium)  # fmt: skip
                table.apply_stored(name, stored)
                parent, engine_hash = engine_hash, engine_hash + 1
    cost = Predictor(settings.cost_params(), clock=clock)
    policy_rng = random.Random(seed + 100)
    router = Router(
        registry=registry, table=table, tokenizer=None,
        policies=build_policies(settings, policy_rng, cost=cost),
        default_policy=settings.default_policy, metrics=RouterMetrics(CollectorRegistry()),
        cost=cost, clock=clock,
    )  # fmt: skip
    profile = router.policy(None)
    index = {name: i for i, name in enumerate(names)}
    record = Record()
    events: list[tuple[float, int, str, Routed, int]] = []
    conversations: list[list[int]] = []
    sequence = 0
    next_arrival = clock.now
    next_scrape = clock.now
    while len(record.rankings) < decisions:
        upcoming = events[0][0] if events else math.inf
        now = min(upcoming, next_arrival, next_scrape)
        clock.now = now
        if now == next_scrape:
            _scrape(registry, cost, rng, now)
            next_scrape = now + 0.05
            continue
        if now == upcoming:
            _, _, kind, routed, completion = heapq.heappop(events)
            state = next(s for s in registry.serving(MODEL) if s.name == routed.ticket.pod)  # type: ignore[union-attr]
            if kind == "first":
                router.first_byte(routed, state)
                cost.pulse(state.name)
            elif kind == "chunk":
                cost.pulse(state.name)
            else:
                cost.pulse(state.name)
                router.finish(routed, completion_tokens=completion)
            continue
        next_arrival = now + rng.expovariate(25.0 if pods <= 16 else 60.0)
        if len(record.rankings) == decisions // 2:  # a quiet spell: idle pods go stale
            next_arrival += 15.0
        request, tokens = _request(table, registry, rng, systems, conversations)
        try:
            decision = profile.decide(request, request.candidates or ())
        except SloUnreachable:
            record.shed += 1
            record.rankings.append([-1])
            record.terms.append({})
            continue
        routed = Routed(decision, request)
        chosen = decision.ranking[0]
        router.dispatch(routed, chosen)
        assert routed.ticket is not None
        prediction = routed.ticket.prediction
        record.rankings.append([index[state.name] for state in decision.ranking])
        record.terms.append({"ttft": prediction.ttft_s, **prediction.terms()})
        slow = slowness[chosen.name] * rng.lognormvariate(0.0, 0.2)
        ttft = max(0.002, 0.01 + prediction.ttft_s * slow)
        completion = rng.randrange(1, 40)
        end = now + ttft + completion * 0.02 * slow
        sequence += 1
        if request.streamed:
            heapq.heappush(events, (now + ttft, sequence, "first", routed, 0))
            for chunk in range(1, min(completion, 6)):
                heapq.heappush(events, (now + ttft + chunk * 0.02 * slow, sequence * 100 + chunk,
                                        "chunk", routed, 0))  # fmt: skip
        heapq.heappush(events, (end, sequence, "end", routed, completion))
        if request.opens_conversation or rng.random() < 0.5:
            conversations.append(tokens + [rng.randrange(1, 50_000) for _ in range(completion)])
            if len(conversations) > 40:
                conversations.pop(rng.randrange(len(conversations)))
    return record


def _request(
    table: SyncPrefixHashTable,
    registry: PodRegistry,
    rng: random.Random,
    systems: list[list[int]],
    conversations: list[list[int]],
) -> tuple[RoutingRequest, list[int]]:
    """One request of the workload's mix, as `Router._routing_request` builds it."""
    roll = rng.random()
    opens = False
    share = 0.0
    if roll < 0.35 or not conversations:  # a new conversation
        system = rng.choice(systems)
        user = [rng.randrange(1, 50_000) for _ in range(rng.randrange(20, 400))]
        tokens = system + user
        opens = True
        share = len(system) / len(tokens) if rng.random() < 0.8 else 0.0
    elif roll < 0.75:  # a later turn
        history = rng.choice(conversations)
        tokens = history + [rng.randrange(1, 50_000) for _ in range(rng.randrange(10, 200))]
    elif roll < 0.82:  # a long unique prompt
        tokens = [rng.randrange(1, 50_000) for _ in range(rng.randrange(9000, 14000))]
    else:  # a unique prompt
        tokens = [rng.randrange(1, 50_000) for _ in range(rng.randrange(50, 3000))]
    hashes = table.prefix_hashes(tokens)
    names = [state.name for state in registry.serving(MODEL)]
    context = ModelContext(MODEL)
    match = table.match(context, hashes, names) if hashes else None
    routable, routable_names = registry.routable_serving(MODEL)
    slo = rng.choice((0.05, 0.2, 0.8)) if rng.random() < 0.12 else None
    streamed = rng.random() < 0.9
    tpot = rng.choice((0.01, 0.03)) if streamed and rng.random() < 0.06 else None
    request = RoutingRequest(
        MODEL, context, len(hashes), match, None, prompt_tokens=len(tokens),
        prompt_tokenized=True, prefix_hashes=hashes, slo_ttft_s=slo, slo_tpot_s=tpot,
        streamed=streamed, opens_conversation=opens, preamble_share=share,
        candidates=registry.serving(MODEL), routable=routable, routable_names=routable_names,
    )  # fmt: skip
    return request, tokens


def _scrape(registry: PodRegistry, cost: Any, rng: random.Random, now: float) -> None:
    """A few pods scraped (the engine's counts: ours and, at times, another replica's)."""
    for state in registry.serving(MODEL):
        if rng.random() < 0.2:
            _, prefilling, decoding = cost.outstanding(state.name)
            others = rng.choice((0, 0, 0, 1, 3))
            state.scraped_at = now
            state.running = float(decoding + rng.randrange(0, 2))
            state.waiting = float(prefilling + others)
            cost.note_scrape(state.name, now)


def run_all() -> dict[str, Any]:
    return {
        name: asyncio.run(replay(pods, seed, shed)).summary()
        for name, (pods, seed, shed) in SCENARIOS.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    results = run_all()
    if args.write:
        GOLDEN.write_text(json.dumps(results, separators=(",", ":")) + "\n")
    for name, summary in results.items():
        print(name, summary["digest"], "shed", summary["shed"], "picks", summary["picks"][:20])


if __name__ == "__main__":
    main()
