"""Canonical CBOR (RFC 8949 §4.2.1: deterministic, shortest forms) for the few types vLLM's
block hash serializes: unsigned and negative integers below 2**64, byte and text strings,
arrays (tuples and lists) and null. Written here rather than depending on `cbor2` for ~40
lines; the tests check it against the RFC's examples and against cbor2 itself."""

from __future__ import annotations

from typing import Any

_NULL = b"\xf6"


def dumps(value: Any) -> bytes:
    out = bytearray()
    _encode(value, out)
    return bytes(out)


def _encode(value: Any, out: bytearray) -> None:
    if value is None:
        out += _NULL
    elif isinstance(value, bool):
        raise TypeError("booleans are not part of vLLM's block hash input")
    elif isinstance(value, int):
        if value >= 0:
            _head(0, value, out)
        else:
            _head(1, -1 - value, out)
    elif isinstance(value, bytes):
        _head(2, len(value), out)
        out += value
    elif isinstance(value, str):
        encoded = value.encode("utf-8")
        _head(3, len(encoded), out)
        out += encoded
    elif isinstance(value, tuple | list):
        _head(4, len(value), out)
        for item in value:
            _encode(item, out)
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as CBOR here")


def _head(major: int, argument: int, out: bytearray) -> None:
    """A data item's initial byte and its argument, in the shortest form."""
    if argument < 0 or argument >= 1 << 64:
        raise ValueError(f"CBOR argument out of range: {argument}")
    kind = major << 5
    if argument < 24:
        out.append(kind | argument)
    elif argument < 1 << 8:
        out.append(kind | 24)
        out.append(argument)
    elif argument < 1 << 16:
        out.append(kind | 25)
        out += argument.to_bytes(2, "big")
    elif argument < 1 << 32:
        out.append(kind | 26)
        out += argument.to_bytes(4, "big")
    else:
        out.append(kind | 27)
        out += argument.to_bytes(8, "big")
