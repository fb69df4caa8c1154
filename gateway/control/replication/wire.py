"""The replica channel's wire format: `[wire, version, replica, [message, ...]]`, msgpack.

Messages: `["d", number, pod, model, lora, [hash, ...], own tokens]` (a decision),
`["b", number]` (its first byte), `["f", number]` (its end), `["h"]` (a heartbeat).
Everything a peer sends is checked field by field against these types and bounds.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

WIRE = "kvgate-sync"
VERSION = 2
"""2: a frame carries a list of messages (1 carried one). Replicas of another version are
ignored (counted as malformed): during a rolling upgrade they route as independent ones."""
MAX_MESSAGE_BYTES = 256 * 1024
"""A frame's size at most (the SUB's MAXMSGSIZE: a larger one costs the connection)."""
MAX_MESSAGES_PER_FRAME = 1024
MAX_HASHES = 16_384
MAX_NAME = 512
MAX_OWN_TOKENS = 10_000_000


def encode(replica: str, messages: list[list[Any]]) -> bytes:
    return bytes(msgpack.packb([WIRE, VERSION, replica, messages]))


def decode(frame: bytes) -> tuple[str, list[Any]] | str:
    """(replica, messages) of a frame, or the reason it is refused."""
    try:
        message = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return "undecodable"
    if (
        not isinstance(message, list)
        or len(message) != 4
        or message[0] != WIRE
        or message[1] != VERSION
        or not isinstance(message[2], str)
        or not 0 < len(message[2]) <= 200
        or not isinstance(message[3], list)
        or not 0 < len(message[3]) <= MAX_MESSAGES_PER_FRAME
    ):
        return "malformed"
    return message[2], message[3]


def valid_decision(body: list[Any]) -> bool:
    """[number, pod, model, lora, hashes, own tokens], each of its type and bounds."""
    if len(body) != 6:
        return False
    number, pod, model, lora, hashes, own = body
    return (
        type(number) is int
        and isinstance(pod, str)
        and 0 < len(pod) <= MAX_NAME
        and isinstance(model, str)
        and 0 < len(model) <= MAX_NAME
        and (lora is None or (isinstance(lora, str) and 0 < len(lora) <= MAX_NAME))
        and isinstance(hashes, list)
        and len(hashes) <= MAX_HASHES
        and _unsigned_64(hashes)
        and isinstance(own, int | float)
        and not isinstance(own, bool)
        and math.isfinite(own)
        and 0 <= own <= MAX_OWN_TOKENS
    )


def _unsigned_64(values: list[Any]) -> bool:
    """Every value an int (no bool) in [0, 2**64), checked in C (a decision has ~100s)."""
    if not values:
        return True
    return set(map(type, values)) == {int} and min(values) >= 0 and max(values) < 1 << 64
