"""Counting rejected frames per pod and reason; logging at most once per pod per interval."""

from __future__ import annotations

import pytest

from subscriber import RejectCounter, RejectVerdict
from tests.helpers import FakeClock


def test_counts_per_pod_and_reason() -> None:
    counter = RejectCounter(clock=FakeClock())
    for pod, reason in [("a", "msgpack"), ("a", "msgpack"), ("a", "bad_hash"), ("b", "msgpack")]:
        counter.record(pod, reason)
    assert counter.snapshot() == {("a", "msgpack"): 2, ("a", "bad_hash"): 1, ("b", "msgpack"): 1}
    assert counter.count() == 4
    assert counter.count(pod="a") == 3
    assert counter.count(reason="msgpack") == 3
    assert counter.count(pod="b", reason="bad_hash") == 0


def test_snapshot_is_a_copy() -> None:
    counter = RejectCounter(clock=FakeClock())
    counter.record("a", "msgpack")
    snap = counter.snapshot()
    counter.record("a", "msgpack")
    assert snap == {("a", "msgpack"): 1}


def test_logs_at_most_once_per_pod_per_interval() -> None:
    clock = FakeClock()
    counter = RejectCounter(log_interval=60.0, clock=clock)
    assert counter.record("a", "msgpack") == RejectVerdict(True, 0)
    assert counter.record("a", "bad_hash") == RejectVerdict(False, 0)
    assert counter.record("b", "msgpack").should_log  # another pod has its own interval
    clock.advance(59.9)
    assert not counter.record("a", "msgpack").should_log
    clock.advance(0.1)
    assert counter.record("a", "msgpack") == RejectVerdict(True, 2)  # two left unlogged
    assert not counter.record("a", "msgpack").should_log
    clock.advance(600)
    assert counter.record("a", "msgpack") == RejectVerdict(True, 1)
    assert counter.count(pod="a") == 6


def test_zero_interval_logs_every_rejection() -> None:
    counter = RejectCounter(log_interval=0, clock=FakeClock())
    assert all(counter.record("a", "msgpack").should_log for _ in range(3))


def test_forget_drops_a_pod() -> None:
    counter = RejectCounter(clock=FakeClock())
    counter.record("a", "msgpack")
    counter.record("b", "msgpack")
    counter.forget("a")
    counter.forget("never-seen")
    assert counter.snapshot() == {("b", "msgpack"): 1}
    assert counter.record("a", "msgpack").should_log  # a returning pod starts afresh


def test_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="log_interval"):
        RejectCounter(log_interval=-1)
