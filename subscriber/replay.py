"""Fetching batches from an engine's replay buffer (its ROUTER socket)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq
import zmq.asyncio

from subscriber.events import DecodeError
from subscriber.frames import ReplayEnd, ReplayEntry, decode_replay_message, encode_replay_request


class ReplayUnavailableError(Exception):
    """The replay socket did not answer in time (or the pod has none)."""


async def fetch_replay(
    context: zmq.asyncio.Context,
    endpoint: str,
    start: int,
    *,
    timeout_s: float,
    max_message_bytes: int,
    on_reject: Callable[[DecodeError], None],
) -> list[ReplayEntry]:
    """Every buffered batch with seq >= `start`, in the order sent; empty when none is.

    A fresh DEALER per request (never REQ, which would stop after one reply), so a late
    answer to an abandoned request can never be mistaken for this one's.
    """
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    entries: list[ReplayEntry] = []
    try:
        dealer.connect(endpoint)
        await dealer.send_multipart(encode_replay_request(start))
        while True:
            if len(entries) % 32 == 31:
                await asyncio.sleep(0)  # replies already waiting would not suspend the loop
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that races with the reply, and the subscriber would then never stop.
                async with asyncio.timeout(timeout_s):
                    frames = await dealer.recv_multipart()
            except TimeoutError:
                raise ReplayUnavailableError(
                    f"no answer from {endpoint} within {timeout_s} s"
                ) from None
            try:
                message = decode_replay_message(frames)
            except DecodeError as exc:
                on_reject(exc)
                continue
            if isinstance(message, ReplayEnd):
                return entries
            entries.append(message)
    finally:
        dealer.close(linger=0)
