"""The KV event relay: an engine's ipc:// PUB and replay ROUTER reached on loopback tcp."""

from __future__ import annotations

import time
from pathlib import Path

import zmq

from bench.harness.fleet import EngineEndpoint
from bench.harness.zmq_relay import EventRelay


def test_events_and_replay_answers_pass_through_the_relay(tmp_path: Path) -> None:
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    publisher.bind(f"ipc://{tmp_path}/events.sock")
    replay = context.socket(zmq.ROUTER)
    replay.bind(f"ipc://{tmp_path}/replay.sock")
    engine = EngineEndpoint("e0", "http://127.0.0.1:1", "m", f"ipc://{tmp_path}/events.sock",
                            f"ipc://{tmp_path}/replay.sock")  # fmt: skip
    relay = EventRelay([engine])
    try:
        (relayed,) = relay.start()
        assert relayed.events.startswith("tcp://127.0.0.1:")
        assert relayed.replay.startswith("tcp://127.0.0.1:")
        subscriber = context.socket(zmq.SUB)
        subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        subscriber.connect(relayed.events)
        deadline = time.monotonic() + 10.0
        received = None
        while received is None and time.monotonic() < deadline:  # until the joins are made
            publisher.send_multipart([b"topic", b"\x00" * 8, b"payload"])
            if subscriber.poll(100):
                received = subscriber.recv_multipart()
        assert received == [b"topic", b"\x00" * 8, b"payload"]

        client = context.socket(zmq.DEALER)
        client.connect(relayed.replay)
        client.send_multipart([b"", b"\x00" * 8])  # a replay request: from this sequence on
        assert replay.poll(10_000)
        *envelope, sequence = replay.recv_multipart()
        assert sequence == b"\x00" * 8
        replay.send_multipart([*envelope, b"answer"])
        assert client.poll(10_000)
        assert client.recv_multipart() == [b"", b"answer"]
        for socket in (subscriber, client):
            socket.close(linger=0)
    finally:
        relay.stop()
        for socket in (publisher, replay):
            socket.close(linger=0)
        context.term()
