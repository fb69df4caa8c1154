"""The default policy decides as it did when the golden record was made: every ranking and
every chosen pod's predicted terms of a fixed-seed replay, bit for bit
(`tests/gateway/routing_replay.py`; re-recorded only for a change of behaviour meant as one)."""

from __future__ import annotations

import json

import pytest

from tests.gateway.routing_replay import GOLDEN, SCENARIOS, replay


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_the_default_policy_decides_as_recorded(scenario: str) -> None:
    expected = json.loads(GOLDEN.read_text())[scenario]
    pods, seed, shed = SCENARIOS[scenario]
    got = (await replay(pods, seed, shed)).summary()
    assert got["picks"] == expected["picks"]
    assert got["shed"] == expected["shed"]
    assert got["first_terms"] == expected["first_terms"]
    assert got["digest"] == expected["digest"]
