"""The fault injector: a seeded plan of faults and the code that applies each one.

The plan draws faults in rounds: each round is every enabled kind once, in a seeded random
order, with a random target engine and random parameters; so 10 faults cover the 10 kinds
and 100 faults cover each ten times. Engine-side faults go through the simulator's
`POST /sim/faults`; process faults kill (SIGKILL) and restart an engine or the gateway.

Each applied fault is a `FaultRecord` whose `settled_at` is when the fault stopped acting
(a drop window ended, the last armed drop fired, the killed process is up again): the
convergence clock starts there.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.fleet import SimProcess
from bench.harness.gateway import GatewayProcess

# Each kind's parameters, drawn from the plan's rng in this order: the simulator's
# `POST /sim/faults` body, or (kills) how the fault is applied here.
_PARAMS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "drop_batches": lambda rng: {"drop_batches": rng.randint(1, 5)},
    "drop_fraction": lambda rng: {
        "drop_fraction": round(rng.uniform(0.3, 0.9), 2),
        "seconds": rng.uniform(0.5, 2),
    },
    "restart_keep_cache": lambda rng: {"restart_publisher": True, "wipe_cache": False},
    "restart_wipe_cache": lambda rng: {"restart_publisher": True, "wipe_cache": True},
    "kill_engine": lambda rng: {"down_s": round(rng.uniform(0.2, 1.5), 2)},
    "stall": lambda rng: {"stall_ms": rng.randint(50, 300), "seconds": rng.uniform(0.5, 2)},
    "fail_5xx": lambda rng: {
        "fail_requests": rng.randint(1, 4),
        "status": rng.choice([500, 502, 503]),
    },
    "close_midstream": lambda rng: {"close_midstream": rng.randint(1, 3)},
    "overrun_replay": lambda rng: {"overrun_replay": rng.randint(1, 3)},
    "kill_gateway": lambda rng: {},
}
KINDS = tuple(_PARAMS)
# The simulator's `faults_fired` counter that shows an armed fault has acted.
_FIRED_KEY = {
    "drop_batches": "drop_batches",
    "fail_5xx": "fail_requests",
    "close_midstream": "close_midstream",
    "overrun_replay": "overrun_replay",
}
FIRE_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class FaultSpec:
    index: int
    kind: str
    engine: int
    params: dict[str, Any]


@dataclass
class FaultRecord:
    spec: FaultSpec
    pod: str | None
    started: float
    settled_at: float = 0.0
    fired: bool = True
    """False when an armed fault did not act within FIRE_TIMEOUT_S (no matching traffic)."""
    notes: dict[str, Any] = field(default_factory=dict)


def fault_plan(
    seed: int, count: int, engines: int, kinds: Sequence[str] = KINDS
) -> list[FaultSpec]:
    rng = random.Random(seed)
    specs: list[FaultSpec] = []
    while len(specs) < count:
        round_kinds = list(kinds)
        rng.shuffle(round_kinds)
        for kind in round_kinds[: count - len(specs)]:
            specs.append(FaultSpec(len(specs), kind, rng.randrange(engines), _PARAMS[kind](rng)))
    return specs


class FaultInjector:
    def __init__(
        self,
        client: httpx.AsyncClient,
        engines: Sequence[SimProcess],
        gateway: GatewayProcess,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._engines = engines
        self._gateway = gateway
        self._clock = clock

    async def apply(self, spec: FaultSpec) -> FaultRecord:
        engine = self._engines[spec.engine]
        pod = None if spec.kind == "kill_gateway" else engine.endpoint.name
        record = FaultRecord(spec, pod, self._clock())
        if spec.kind == "kill_gateway":
            await self._gateway.kill()
            record.notes["killed_at"] = self._clock()
            await self._gateway.start()
        elif spec.kind == "kill_engine":
            await engine.kill()
            record.notes["killed_at"] = self._clock()
            await asyncio.sleep(spec.params["down_s"])
            await engine.start()
        elif spec.kind in ("drop_fraction", "stall"):
            await self.arm(engine, spec.params)
            await asyncio.sleep(spec.params["seconds"])
        elif spec.kind in _FIRED_KEY:
            key = _FIRED_KEY[spec.kind]
            before = (await self.fired(engine)).get(key, 0)
            await self.arm(engine, spec.params)
            wanted = before + int(spec.params[key])
            record.fired = await self._wait_fired(engine, key, wanted)
        else:
            await self.arm(engine, spec.params)
        record.settled_at = self._clock()
        return record

    async def arm(self, engine: SimProcess, spec: dict[str, Any]) -> dict[str, Any]:
        response = await self._client.post(f"{engine.endpoint.url}/sim/faults", json=spec)
        response.raise_for_status()
        armed: dict[str, Any] = response.json()["armed"]
        return armed

    async def fired(self, engine: SimProcess) -> dict[str, int]:
        response = await self._client.get(f"{engine.endpoint.url}/sim/stats")
        response.raise_for_status()
        fired: dict[str, int] = response.json()["faults_fired"]
        return fired

    async def _wait_fired(self, engine: SimProcess, key: str, wanted: int) -> bool:
        deadline = self._clock() + FIRE_TIMEOUT_S
        while self._clock() < deadline:
            if (await self.fired(engine)).get(key, 0) >= wanted:
                return True
            await asyncio.sleep(0.05)
        return False
