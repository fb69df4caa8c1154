"""The `overrun_replay` fault: batches lost live *and* gone from the replay buffer."""

from __future__ import annotations

import asyncio

import httpx
import zmq

from tests.conftest import StartEngine
from tests.simulator.test_publisher import Sockets, complete, replay, subscribe, zctx

__all__ = ["zctx"]  # the fixture, used by name


async def test_overrun_replay_drops_live_and_leaves_the_replay_buffer_behind(
    start_engine: StartEngine, zctx: Sockets
) -> None:
    server = await start_engine()
    sub = await subscribe(zctx, server)
    await complete(server, "first prompt " * 10)
    first = await asyncio.wait_for(sub.recv_multipart(), 5)
    assert int.from_bytes(first[1], "big") == 0
    async with httpx.AsyncClient(base_url=server.url) as client:
        armed = await client.post("/sim/faults", json={"overrun_replay": 2})
        assert armed.status_code == 200 and armed.json()["armed"] == {"overrun_replay": 2}
        await complete(server, "second prompt " * 10)
        await complete(server, "third prompt " * 10)
        await complete(server, "fourth prompt " * 10)
        stats = (await client.get("/sim/stats")).json()
    assert stats["faults_fired"]["overrun_replay"] == 2
    assert stats["publisher"]["pending_events"] == 0  # an idle engine has published all
    live = await asyncio.wait_for(sub.recv_multipart(), 5)
    assert int.from_bytes(live[1], "big") == 3  # seq 1 and 2 never arrived live
    replies = await replay(zctx, server, 0)
    seqs = [int.from_bytes(r[2], "big") for r in replies[:-1]]
    # Asked from 0, the buffer starts after what the subscriber last saw (seq 0): it has
    # overrun. It still holds the newest batches, the last dropped one included.
    assert seqs == [2, 3]
    assert not await sub.poll(200, zmq.POLLIN)  # nothing else was sent live


async def test_overrun_replay_is_validated(start_engine: StartEngine) -> None:
    server = await start_engine()
    async with httpx.AsyncClient(base_url=server.url) as client:
        bad = await client.post("/sim/faults", json={"overrun_replay": -1})
        assert bad.status_code == 400 and "overrun_replay" in bad.text
