"""A hostile bootstrap peer: a real uvicorn server answering `/admin/cost-model` with what
no gateway exports (numbers beyond a float, coefficients of 1e300, 400 MB). The replica
starts anyway, from the prior, and counts why."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.http.server import GatewayServer
from predictor import MAX_EXPORT_BYTES, REASONS, Predictor
from tests.gateway.conftest import Gateway, StartGateway
from tests.helpers import ROOT, eventually, free_port

CHUNK = b" " * (1 << 20)


class HostilePeer:
    """Serves `/admin/cost-model` and `/admin/pods` as the test sets them, and counts
    the bytes its streamed answers handed to the connection."""

    def __init__(self) -> None:
        self.answer: Callable[[Request], Response] = lambda request: JSONResponse({})
        self.pods: Callable[[Request], Response] = lambda request: JSONResponse({"pods": []})
        self.sent = 0
        routes = [
            Route("/admin/cost-model", lambda request: self.answer(request)),
            Route("/admin/pods", lambda request: self.pods(request)),
        ]
        self.server = GatewayServer(Starlette(routes=routes))

    @property
    def url(self) -> str:
        return self.server.url

    def stream(self, request: Request, megabytes: int) -> StreamingResponse:
        """`{` and then `megabytes` MB of spaces (valid JSON so far), never held at once;
        cut when the client goes (uvicorn drops what is written after)."""

        async def body() -> AsyncIterator[bytes]:
            yield b"{"
            for _ in range(megabytes):
                if await request.is_disconnected():
                    return
                self.sent += len(CHUNK)
                yield CHUNK

        return StreamingResponse(body(), media_type="application/json")


@pytest.fixture
async def peer() -> AsyncIterator[HostilePeer]:
    hostile = HostilePeer()
    await hostile.server.start()
    yield hostile
    await hostile.server.stop()


def exported(**fleet: Any) -> dict[str, Any]:
    """A valid export (the prior's) with `fleet` fields replaced."""
    state = Predictor().export()
    state["fleet"].update(fleet)
    return state


def raw(text: str) -> Callable[[Request], Response]:
    return lambda request: Response(text, media_type="application/json")


def rejected(gw: Gateway) -> dict[str, float]:
    registry = gw.state.metrics.prometheus
    return {
        reason: registry.get_sample_value("kvgate_bootstrap_rejected_total", {"reason": reason})
        for reason in REASONS
    }


def prior(gw: Gateway) -> dict[str, Any]:
    return Predictor(gw.app.state.gateway.settings.cost_params()).export()


HOSTILE = [
    ("observations 1e400", raw(json.dumps(exported()).replace('"observations": 0', '"observations": 1e400')), "non_finite"),  # noqa: E501
    ("coefficients 1e300", lambda _: JSONResponse(exported(theta=[1e300] * 7)), "out_of_range"),
    ("NaN", raw(json.dumps(exported()).replace('"reference": 0.0', '"reference": NaN')), "non_finite"),  # noqa: E501
    ("deep", raw("[" * 200_000), "malformed"),
    ("not JSON", raw("<html>"), "malformed"),
    ("version 1", lambda _: JSONResponse({**exported(), "version": 1}), "unsupported_version"),
    ("a 500", lambda _: Response("boom", status_code=500), "peer_unavailable"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "answer", "reason"), HOSTILE, ids=[c[0] for c in HOSTILE])
async def test_a_hostile_cost_model_is_refused_counted_and_the_replica_starts_from_the_prior(
    start_gateway: StartGateway,
    peer: HostilePeer,
    case: str,
    answer: Callable[[Request], Response],
    reason: str,
) -> None:
    peer.answer = answer
    gw = await start_gateway(engines=1, bootstrap_peer=peer.url)
    async with gw.client() as client:
        assert (await client.get("/health")).status_code == 200
    assert rejected(gw) == {r: float(r == reason) for r in REASONS}
    assert gw.state.router.cost.export() == prior(gw)


async def test_a_valid_export_is_taken(start_gateway: StartGateway, peer: HostilePeer) -> None:
    """The same peer with a sane answer: taken (the checks refuse nothing a gateway sends)."""
    sane = exported(theta=[0.03, 0.2, 0.02, 0.01, 0.03, 1.0, 0.05], observations=12)
    sane["speeds"] = {"e0": {"log": 0.5, "observations": 4}}
    peer.answer = lambda _: JSONResponse(sane)
    gw = await start_gateway(engines=1, bootstrap_peer=peer.url)
    assert gw.state.router.cost.export() == sane
    assert set(rejected(gw).values()) == {0.0}


async def test_a_400_mb_cost_model_is_cut_off_at_the_cap(
    start_gateway: StartGateway, peer: HostilePeer
) -> None:
    peer.answer = lambda request: peer.stream(request, 400)
    gw = await start_gateway(engines=1, bootstrap_peer=peer.url)
    assert rejected(gw)["too_large"] == 1
    assert gw.state.router.cost.export() == prior(gw)
    # The replica stopped reading at the cap: what the peer got out is that and the
    # sockets' buffers, nowhere near its 400 MB.
    assert peer.sent < MAX_EXPORT_BYTES + 32 * len(CHUNK)


Answer = Callable[[HostilePeer, Request], Response]
PODS: list[tuple[str, Answer, str]] = [
    ("deep", lambda peer, request: raw("[" * 200_000)(request), "malformed"),
    ("no list", lambda peer, request: raw('{"pods": 1e400}')(request), "malformed"),
    ("20 MB", lambda peer, request: peer.stream(request, 20), "too_large"),
    ("a 404", lambda peer, request: Response("no", status_code=404), "peer_unavailable"),
]


@pytest.mark.parametrize(("case", "answer", "reason"), PODS, ids=[c[0] for c in PODS])
async def test_a_hostile_pods_list_is_refused_and_counted(
    start_gateway: StartGateway, peer: HostilePeer, case: str, answer: Answer, reason: str
) -> None:
    """The index snapshots' side of the bootstrap: the peer's `/admin/pods` is bounded and
    checked too (its cost model is fine here, and taken)."""
    peer.pods = lambda request: answer(peer, request)
    peer.answer = lambda _: JSONResponse(exported(observations=3))
    gw = await start_gateway(engines=1, bootstrap_peer=peer.url)
    value = gw.state.metrics.prometheus.get_sample_value(
        "kvgate_snapshots_ignored_total", {"reason": reason}
    )
    assert value == 1
    assert gw.state.router.cost.fleet.observations == 3


async def test_pods_with_names_of_any_json_type_are_skipped(
    start_gateway: StartGateway, peer: HostilePeer
) -> None:
    """Not asked for (this peer would answer each with a 404, counted)."""
    names = [{"x": 1}, 7, None, "", "p" * 254, ["a"]]
    listed = {"pods": [{"name": name, "subscriber": {}} for name in names]}
    peer.pods = lambda _: JSONResponse(listed)
    gw = await start_gateway(engines=1, bootstrap_peer=peer.url)
    registry = gw.state.metrics.prometheus
    assert registry.get_sample_value("kvgate_snapshots_ignored_total",
                                     {"reason": "peer_unavailable"}) == 0  # fmt: skip
    listed["pods"].append({"name": "real", "subscriber": {}})  # and the control: one asked
    again = await start_gateway(engines=1, bootstrap_peer=peer.url)
    assert (
        again.state.metrics.prometheus.get_sample_value(
            "kvgate_snapshots_ignored_total", {"reason": "peer_unavailable"}
        )
        == 1
    )


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
async def test_kvgate_serve_bootstrapped_by_a_400_mb_answer_stays_small(
    peer: HostilePeer, tmp_path: Path
) -> None:
    """`kvgate serve` as deployed, its peer streaming 400 MB: it starts, refuses the answer
    and its peak RSS stays far below what holding the answer would take."""
    peer.answer = lambda request: peer.stream(request, 400)
    pods = tmp_path / "pods.json"
    pods.write_text('{"pods": []}')
    port = free_port()
    env = {**os.environ, "KVGATE_BOOTSTRAP_PEER": peer.url, "KVGATE_ADMIN_TOKEN": "t"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--pods", str(pods), "--port", str(port),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            async def up() -> bool:
                try:
                    return (await client.get("/health")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(up, within=60, what="kvgate serve answering")
            page = (await client.get("/metrics", headers={"authorization": "Bearer t"})).text
        peak = _peak_rss_bytes(process.pid)
    finally:
        process.terminate()
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert 'kvgate_bootstrap_rejected_total{reason="too_large"} 1.0' in page
    assert peak < 300 * 1024 * 1024, peak
    assert b"Traceback" not in stderr
    warnings = [line for line in stderr.decode().splitlines() if "cost model from" in line]
    assert len(warnings) == 1 and "too_large" in warnings[0], warnings
