"""The ZMQ multipart frames around KV event payloads (PUB messages and replay replies).

- PUB message: ``[topic, seq, payload]``; seq is 8 bytes big-endian unsigned, starting at
  0 when the engine process starts; the topic may be empty.
- Replay request (DEALER -> ROUTER): ``[b"", start_seq]``.
- Replay reply, per buffered batch with seq >= start: ``[b"", topic, seq, payload]``
  (vLLM <= 0.23 and older SGLang: ``[b"", seq, payload]``), then the end marker with seq
  ``ff..ff`` (-1 signed) and an empty payload.

Errors are `DecodeError` with reason ``frame_count`` (wrong number of frames),
``bad_frame`` (the replay delimiter is not empty) or ``bad_seq`` (not 8 bytes). Topics are
decoded as UTF-8 with replacement: a strange topic never rejects a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from subscriber.events import DecodeError

SEQ_BYTES: Final = 8
MAX_SEQ: Final = 2**64 - 2
"""The largest seq that can be sent: 2**64 - 1 is taken by the replay end marker."""
REPLAY_END_SEQ: Final = b"\xff" * SEQ_BYTES
"""The end marker's seq frame: -1 as a signed 64-bit big-endian int."""


@dataclass(frozen=True, slots=True)
class ReplayEntry:
    """One replayed batch; `payload` is still msgpack (decode it with `decode_batch`)."""

    seq: int
    payload: bytes
    topic: str | None = None
    """None in the older 3-frame form, which carries no topic."""


@dataclass(frozen=True, slots=True)
class ReplayEnd:
    """The end of one replay answer: every buffered batch with seq >= start was sent."""

    topic: str | None = None


def decode_pub_message(frames: Sequence[bytes]) -> tuple[str, int, bytes]:
    """Split a PUB message into (topic, seq, payload); the payload is not decoded here."""
    if len(frames) != 3:
        raise DecodeError("frame_count", f"PUB message has {len(frames)} frames, expected 3")
    topic, seq, payload = frames
    return _topic(topic), _seq(seq), payload


def decode_replay_message(frames: Sequence[bytes]) -> ReplayEntry | ReplayEnd:
    """Decode one replay reply as a DEALER receives it (the empty delimiter first).

    Both ``[b"", topic, seq, payload]`` and the older ``[b"", seq, payload]`` are accepted.
    A seq of ``ff..ff`` is the end marker whatever the payload (vLLM sends it empty).
    """
    count = len(frames)
    if count == 4:
        delimiter, raw_topic, seq, payload = frames
        topic: str | None = _topic(raw_topic)
    elif count == 3:
        delimiter, seq, payload = frames
        topic = None
    else:
        raise DecodeError("frame_count", f"replay reply has {count} frames, expected 3 or 4")
    if delimiter:
        raise DecodeError("bad_frame", f"replay reply delimiter is {len(delimiter)} bytes")
    if seq == REPLAY_END_SEQ:
        return ReplayEnd(topic)
    return ReplayEntry(_seq(seq), payload, topic)


def encode_replay_request(start_seq: int) -> list[bytes]:
    """The DEALER frames asking a pod's ROUTER for every buffered batch from `start_seq`."""
    return [b"", _seq_bytes(start_seq)]


def decode_replay_request(frames: Sequence[bytes]) -> int:
    """The start seq of a replay request as a ROUTER sees it after the identity frame."""
    if len(frames) != 2:
        raise DecodeError("frame_count", f"replay request has {len(frames)} frames, expected 2")
    if frames[0]:
        raise DecodeError("bad_frame", "replay request delimiter is not empty")
    return _seq(frames[1])


def encode_pub_message(topic: str, seq: int, payload: bytes) -> list[bytes]:
    """The frames of one PUB message, as vLLM sends them."""
    return [topic.encode(), _seq_bytes(seq), payload]


def encode_replay_entry(seq: int, payload: bytes, topic: str | None = "") -> list[bytes]:
    """One replay reply (without the ROUTER identity); ``topic=None`` gives the old form."""
    if topic is None:
        return [b"", _seq_bytes(seq), payload]
    return [b"", topic.encode(), _seq_bytes(seq), payload]


def encode_replay_end(topic: str | None = "") -> list[bytes]:
    """The end marker closing a replay answer (vLLM 0.32 sends it with an empty topic)."""
    if topic is None:
        return [b"", REPLAY_END_SEQ, b""]
    return [b"", topic.encode(), REPLAY_END_SEQ, b""]


def _topic(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _seq(raw: bytes) -> int:
    if len(raw) != SEQ_BYTES:
        raise DecodeError("bad_seq", f"seq frame is {len(raw)} bytes, expected {SEQ_BYTES}")
    return int.from_bytes(raw, "big")


def _seq_bytes(seq: int) -> bytes:
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"seq must be an int in [0, 2**64 - 1), got {seq!r}")
    return seq.to_bytes(SEQ_BYTES, "big")
