"""Helpers shared by the indexer tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from indexer import IndexConfig, IndexLimits, SyncPrefixHashTable
from tests.helpers import FakeClock
from tests.indexer.native_build import import_requested_build


def pytest_configure(config: pytest.Config) -> None:
    """The build KVGATE_TEST_NATIVE_BUILD names, if any, is the one under test."""
    import_requested_build()


@dataclass(frozen=True, slots=True)
class Stored:
    """A BlockStored event with vLLM's field names (what the subscriber's decoder yields)."""

    block_hashes: Sequence[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: Sequence[int]
    block_size: int = 4
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = "GPU"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_table(
    clock: FakeClock, *, block_size: int = 4, limits: IndexLimits | None = None
) -> SyncPrefixHashTable:
    config = IndexConfig(block_size=block_size, limits=limits or IndexLimits())
    return SyncPrefixHashTable(config, clock=clock)
