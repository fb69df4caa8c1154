"""The ZMQ frames around payloads: PUB messages, replay requests and replies."""

from __future__ import annotations

import pytest

from subscriber import (
    REPLAY_END_SEQ,
    DecodeError,
    ReplayEnd,
    ReplayEntry,
    decode_pub_message,
    decode_replay_message,
    decode_replay_request,
    encode_pub_message,
    encode_replay_end,
    encode_replay_entry,
    encode_replay_request,
)

SEQ7 = (7).to_bytes(8, "big")


def reason_of(call: object, *args: object) -> str:
    assert callable(call)
    with pytest.raises(DecodeError) as info:
        call(*args)
    return info.value.reason


def test_pub_message() -> None:
    assert decode_pub_message([b"kv-events", SEQ7, b"\x90"]) == ("kv-events", 7, b"\x90")
    assert decode_pub_message([b"", b"\xff" * 8, b""]) == ("", 2**64 - 1, b"")
    assert decode_pub_message(encode_pub_message("t", 2**40, b"p")) == ("t", 2**40, b"p")


def test_pub_message_topic_is_never_a_reason_to_reject() -> None:
    topic, _, _ = decode_pub_message([b"kv\xff", SEQ7, b""])
    assert topic == "kv\ufffd"
    # SGLang appends epoch metadata to the topic after a NUL byte
    assert decode_pub_message([b"kv\x00sgl-kv-epoch=abc", SEQ7, b""])[0] == "kv\x00sgl-kv-epoch=abc"


@pytest.mark.parametrize("frames", [[], [b"t"], [b"t", SEQ7], [b"t", SEQ7, b"p", b"x"]])
def test_pub_message_frame_count(frames: list[bytes]) -> None:
    assert reason_of(decode_pub_message, frames) == "frame_count"


@pytest.mark.parametrize("seq", [b"", b"\x00" * 7, b"\x00" * 9])
def test_pub_message_bad_seq(seq: bytes) -> None:
    assert reason_of(decode_pub_message, [b"t", seq, b"p"]) == "bad_seq"


def test_replay_reply_forms() -> None:
    assert decode_replay_message([b"", b"kv", SEQ7, b"p"]) == ReplayEntry(7, b"p", "kv")
    assert decode_replay_message([b"", SEQ7, b"p"]) == ReplayEntry(7, b"p", None)
    assert decode_replay_message([b"", b"", REPLAY_END_SEQ, b""]) == ReplayEnd("")
    assert decode_replay_message([b"", REPLAY_END_SEQ, b""]) == ReplayEnd(None)
    assert (-1).to_bytes(8, "big", signed=True) == REPLAY_END_SEQ


def test_replay_reply_encoders_round_trip() -> None:
    assert decode_replay_message(encode_replay_entry(3, b"p", "kv")) == ReplayEntry(3, b"p", "kv")
    assert decode_replay_message(encode_replay_entry(3, b"p", None)) == ReplayEntry(3, b"p")
    assert decode_replay_message(encode_replay_end("kv")) == ReplayEnd("kv")
    assert decode_replay_message(encode_replay_end(None)) == ReplayEnd(None)
    assert encode_replay_end() == [b"", b"", REPLAY_END_SEQ, b""]


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "frame_count"),
        ([b"", SEQ7], "frame_count"),
        ([b"", b"t", SEQ7, b"p", b"x"], "frame_count"),
        ([b"id", SEQ7, b"p"], "bad_frame"),
        ([b"id", b"t", SEQ7, b"p"], "bad_frame"),
        ([b"", b"\x07", b"p"], "bad_seq"),
        ([b"", b"t", b"\xff" * 7, b""], "bad_seq"),
    ],
)
def test_replay_reply_rejections(frames: list[bytes], reason: str) -> None:
    assert reason_of(decode_replay_message, frames) == reason


def test_replay_request() -> None:
    assert encode_replay_request(0) == [b"", b"\x00" * 8]
    assert encode_replay_request(258) == [b"", b"\x00" * 6 + b"\x01\x02"]
    assert decode_replay_request(encode_replay_request(2**63)) == 2**63
    assert reason_of(decode_replay_request, [b"", b"\x01"]) == "bad_seq"
    assert reason_of(decode_replay_request, [b"x", SEQ7]) == "bad_frame"
    assert reason_of(decode_replay_request, [SEQ7]) == "frame_count"


@pytest.mark.parametrize("seq", [-1, 2**64 - 1, 2**64, 1.0, True])
def test_unencodable_seq(seq: object) -> None:
    with pytest.raises(ValueError, match="seq"):
        encode_replay_request(seq)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seq"):
        encode_pub_message("t", seq, b"")  # type: ignore[arg-type]
