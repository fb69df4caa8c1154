"""Fixtures shared by every test package: real simulated engines on loopback, ephemeral ports."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from simulator import EngineServer, LatencyModel, SimConfig, SimEngine

FAST = LatencyModel(time_scale=1000.0)

StartEngine = Callable[..., Awaitable[EngineServer]]


def loopback_config(**overrides: Any) -> SimConfig:
    base = SimConfig(
        port=0,
        events_endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
        latency=FAST,
        gpu_blocks=256,
    )
    return dataclasses.replace(base, **overrides)


@pytest.fixture
async def start_engine() -> AsyncIterator[StartEngine]:
    """Start engines (shut down at the end of the test) from SimConfig overrides."""
    servers: list[EngineServer] = []

    async def start(**overrides: Any) -> EngineServer:
        server = EngineServer(SimEngine(loopback_config(**overrides)))
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        await server.stop()
