"""The load generator, run as its own process: `python -m bench.routing.loadgen SPEC OUT`.

It rebuilds the script from the spec (same workload, size and seed: the same requests),
sends them to the router as streamed chat completions and writes one record per request
to OUT (JSON); with a `picker`, through it as Envoy sends them (`EnvoyRelay`: the pick
over ext_proc, then straight to the picked engine). `open`: every request at its time
from `script.schedule`, so a slow router builds a queue rather than slowing the arrivals
down; `closed`: `concurrency` users, each running conversations back to back (they join
one by one over `ramp_s`). Spec and script times are model seconds, divided here by the
time scale.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.harness.envoy_relay import EnvoyRelay
from bench.harness.streaming import RequestRecord, post_chat
from bench.routing.script import Conversation, Script, schedule
from bench.routing.trace import TraceSpec
from bench.routing.workloads import WorkloadSize, script_of
from gateway.epp.client import EnvoyClient

CHAT = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class LoadSpec:
    router_url: str
    model: str
    workload: str
    size: WorkloadSize
    seed: int
    mode: str
    """`open` (Poisson conversation starts at `rate`) or `closed` (`concurrency` users)."""
    rate: float
    """Requests per model second (open mode)."""
    concurrency: int
    time_scale: float
    timeout_s: float = 120.0
    ramp_s: float = 0.0
    """Closed loop: the users join one by one, evenly over this many model seconds."""
    replica_urls: tuple[str, ...] = ()
    """Several gateway replicas: requests go to them in turn, each request to the next
    (an L7 balancer in front of their Service); empty: all to `router_url`."""
    slo_tpot_ms: float | None = None
    """Each request's `x-slo-tpot-ms`, in model ms (sent in wall ms)."""
    trace: TraceSpec | None = None
    """A replayed trace: the workload's requests."""
    vocabulary: tuple[str, ...] | None = None
    """The single-token words a trace's prompts are written in (None: the simulator's)."""
    picker: str = ""
    """An endpoint picker's gRPC target (`host:port`, `kvgate epp`): each request goes
    through it as Envoy sends it, then to the engine it picks; empty: to the router."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["trace"] = None if self.trace is None else self.trace.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoadSpec:
        replicas = tuple(data.get("replica_urls", ()))
        trace = data.get("trace")
        vocabulary = data.get("vocabulary")
        return cls(**{**data, "size": WorkloadSize(**data["size"]), "replica_urls": replicas,
                      "trace": None if trace is None else TraceSpec.from_json(trace),
                      "vocabulary": None if vocabulary is None else tuple(vocabulary)})  # fmt: skip

    def script(self) -> Script:
        return script_of(self.workload, self.size, self.seed, self.trace, self.vocabulary)

    def urls(self) -> RouterUrls:
        return RouterUrls(self.replica_urls or (self.router_url,))


class RouterUrls:
    """Where each request goes: the replicas in turn, one request each — as an L7 balancer
    does, with readiness: a replica that fails to answer is left out until its `/ready`
    answers 200 again (checked every `probe_s`), as a Service drops an endpoint whose
    readiness probe fails."""

    def __init__(self, urls: tuple[str, ...], probe_s: float = 0.25) -> None:
        self._urls = urls
        self._sent = 0
        self.probe_s = probe_s
        self.down: set[str] = set()

    def __call__(self) -> str:
        for _ in range(len(self._urls)):
            url = self._urls[self._sent % len(self._urls)]
            self._sent += 1
            if url not in self.down:
                return url
        return self._urls[self._sent % len(self._urls)]  # all down: try anyway

    def failed(self, url: str) -> None:
        """No answer from `url` (connection refused or cut): out of the rotation."""
        if len(self._urls) > 1:
            self.down.add(url)

    async def probe(self, client: httpx.AsyncClient) -> None:
        """Readmit replicas whose `/ready` answers 200 (runs until cancelled)."""
        while True:
            await asyncio.sleep(self.probe_s)
            for url in sorted(self.down):
                try:
                    ready = (await client.get(f"{url}/ready", timeout=1.0)).status_code == 200
                except httpx.HTTPError:
                    ready = False
                if ready:
                    self.down.discard(url)


async def send(
    client: httpx.AsyncClient,
    spec: LoadSpec,
    conversation: Conversation,
    index: int,
    router: RouterUrls,
    relay: EnvoyRelay | None = None,
) -> RequestRecord:
    turn = conversation.turns[index]
    body = {
        "model": spec.model,
        "messages": turn.request_messages(),
        "max_tokens": turn.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-session-id": conversation.conversation_id}
    if spec.slo_tpot_ms is not None:
        headers["x-slo-tpot-ms"] = f"{spec.slo_tpot_ms / spec.time_scale:.3f}"
    if relay is not None:
        return await _through_picker(relay, body, headers, conversation, index)
    url = router()
    answer = await post_chat(client, f"{url}{CHAT}", body, headers)
    if answer.status is None or answer.failure == "cut":
        router.failed(url)
    error = answer.error
    if error is None and not answer.token_times:
        error = "no generated text in the stream"
    return RequestRecord.of(
        answer, error=error, conversation=conversation.conversation_id, tag=conversation.tag,
        turn=index, router_url=url if len(spec.replica_urls) > 1 else "",
    )  # fmt: skip


async def _through_picker(
    relay: EnvoyRelay,
    body: dict[str, Any],
    headers: dict[str, str],
    conversation: Conversation,
    index: int,
) -> RequestRecord:
    """The request as Envoy sends it through the picker; its pod: the endpoint picked."""
    relayed = await relay.post_chat(CHAT, body, headers)
    answer = relayed.answer
    error = answer.error
    if error is None and not answer.token_times:
        error = "no generated text in the stream"
    record = RequestRecord.of(answer, error=error, conversation=conversation.conversation_id,
                              tag=conversation.tag, turn=index)  # fmt: skip
    pick_s = None if relayed.picked is None else relayed.picked - answer.started
    return dataclasses.replace(record, pod=relayed.endpoint, pick_s=pick_s)


ENGINE_KEEPALIVE_S = 4.0
"""Through a picker the requests go straight to the engines, which close a connection idle
for 5 s (uvicorn's default): reused at that moment, it fails the request being sent (an
httpx ReadError). Dropped sooner, as kvgate's own upstream pool drops them (4 s)."""
CLIENT_SHARDS = 8
"""httpx clients the requests take in turn. One client's connection pool re-examines every
connection for every request it starts and every response it ends (httpcore 1.0: quadratic
in the connections open); at ~100 concurrent streams that CPU made the load generator
itself fall behind a burst of arrivals and deliver requests late, 60 ms apart, for seconds —
a stall measured as the router's TTFT. Sharded, each pool holds an eighth of them."""


class ClientShards:
    """`CLIENT_SHARDS` httpx clients, handed out in turn; an idle connection is dropped
    after `keepalive_s`."""

    def __init__(
        self, spec: LoadSpec, shards: int = CLIENT_SHARDS, *, keepalive_s: float = 5.0
    ) -> None:
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=256, keepalive_expiry=keepalive_s
        )
        timeout = httpx.Timeout(spec.timeout_s, connect=10.0)
        self.clients = [httpx.AsyncClient(limits=limits, timeout=timeout) for _ in range(shards)]
        self._turn = 0

    def __call__(self) -> httpx.AsyncClient:
        self._turn = (self._turn + 1) % len(self.clients)
        return self.clients[self._turn]

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


async def run(spec: LoadSpec, script: Script) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    router = spec.urls()
    clients = ClientShards(spec, keepalive_s=ENGINE_KEEPALIVE_S if spec.picker else 5.0)
    envoy = EnvoyClient(spec.picker) if spec.picker else None
    relay = None if envoy is None else EnvoyRelay(envoy, clients, timeout_s=spec.timeout_s)
    try:
        if envoy is not None:  # connected before the first request, as Envoy's is
            async with asyncio.timeout(spec.timeout_s):
                await envoy.wait_ready()
        prober = asyncio.create_task(router.probe(clients.clients[0]))
        try:
            await _drive(spec, script, clients, records, router, relay)
        finally:
            prober.cancel()
    finally:
        if envoy is not None:
            await envoy.close()
        await clients.aclose()
    return records


async def _drive(
    spec: LoadSpec,
    script: Script,
    clients: ClientShards,
    records: list[RequestRecord],
    router: RouterUrls,
    relay: EnvoyRelay | None = None,
) -> None:
    """Send the script's requests (open or closed loop), appending each one's record."""
    scale = spec.time_scale

    async def one(conversation: Conversation, index: int) -> None:
        records.append(await send(clients(), spec, conversation, index, router, relay))

    if spec.mode == "open":
        origin = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for at, conversation, index in schedule(script, spec.rate, spec.seed):
                await asyncio.sleep(max(0.0, origin + at / scale - time.perf_counter()))
                group.create_task(one(script.conversations[conversation], index))
        return
    queue = list(reversed(script.conversations))

    async def user(number: int) -> None:
        await asyncio.sleep(number * spec.ramp_s / spec.concurrency / scale)
        while queue:
            conversation = queue.pop()
            for index, turn in enumerate(conversation.turns):
                await one(conversation, index)
                if index + 1 < len(conversation.turns):
                    await asyncio.sleep(turn.think_s / scale)

    async with asyncio.TaskGroup() as group:
        for number in range(spec.concurrency):
            group.create_task(user(number))


def main(argv: list[str]) -> int:
    spec_path, out_path = Path(argv[0]), Path(argv[1])
    spec = LoadSpec.from_json(json.loads(spec_path.read_text()))
    script = spec.script()
    import uvloop

    records = uvloop.run(run(spec, script))
    out_path.write_text(json.dumps([asdict(r) for r in records]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
