"""Engines' KV event sockets relayed from ipc:// onto loopback tcp://, for a peer that
takes tcp endpoints only (vllm-router `kv_aware`: "tcp://HOST:PORT").

Real vLLM engines publish on ipc:// sockets in the run directory (`vllm_fleet`: vLLM binds
its PUB socket only on a wildcard tcp endpoint, every interface, or on ipc://). Each relay
is a ZMQ proxy in its own thread: SUB (connected to the engine's PUB) → PUB bound on
127.0.0.1, and, for the replay channel, ROUTER bound on 127.0.0.1 → DEALER connected to the
engine's ROUTER, which carries each request's envelope there and its answer back.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import zmq

from bench.harness.fleet import EngineEndpoint

LOOPBACK = "tcp://127.0.0.1"


class EventRelay:
    """`start()` relays every ipc:// endpoint of `endpoints` (the others pass unchanged)
    and returns them as the peer should see them; `stop()` ends every proxy."""

    def __init__(self, endpoints: Sequence[EngineEndpoint]) -> None:
        self._endpoints = list(endpoints)
        self._context = zmq.Context()
        self._threads: list[tuple[threading.Thread, zmq.Socket[bytes]]] = []

    def start(self) -> list[EngineEndpoint]:
        relayed = []
        for endpoint in self._endpoints:
            events, replay = endpoint.events, endpoint.replay
            if events.startswith("ipc://"):
                events = self._relay(zmq.SUB, events, zmq.PUB)
            if replay.startswith("ipc://"):
                replay = self._relay(zmq.DEALER, replay, zmq.ROUTER)
            relayed.append(dataclasses.replace(endpoint, events=events, replay=replay))
        return relayed

    def _relay(self, engine_side: int, address: str, peer_side: int) -> str:
        """A proxy between a socket connected to the engine's `address` and one bound on
        loopback (its address returned)."""
        engine = self._context.socket(engine_side)
        if engine_side == zmq.SUB:
            engine.setsockopt(zmq.SUBSCRIBE, b"")
        engine.connect(address)
        peer = self._context.socket(peer_side)
        port = peer.bind_to_random_port(LOOPBACK)
        control = self._context.socket(zmq.PAIR)
        control_address = f"inproc://relay-{len(self._threads)}"
        control.bind(control_address)
        steer = self._context.socket(zmq.PAIR)
        steer.connect(control_address)
        # The sockets move to the proxy's thread, used there only from now on.
        frontend, backend = (peer, engine) if peer_side == zmq.ROUTER else (engine, peer)
        thread = threading.Thread(
            target=_proxy, args=(frontend, backend, control), name=f"relay {address}", daemon=True
        )
        thread.start()
        self._threads.append((thread, steer))
        return f"{LOOPBACK}:{port}"

    def stop(self) -> None:
        for thread, steer in self._threads:
            steer.send(b"TERMINATE")
            thread.join(timeout=5.0)
            steer.close(linger=0)
        self._threads.clear()
        self._context.term()


def _proxy(
    frontend: zmq.Socket[bytes], backend: zmq.Socket[bytes], control: zmq.Socket[bytes]
) -> None:
    try:
        zmq.proxy_steerable(frontend, backend, None, control)
    finally:
        for socket in (frontend, backend, control):
            socket.close(linger=0)
