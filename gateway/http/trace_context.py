"""W3C Trace Context (level 1) at the gateway's edge: a client's `traceparent` is checked
before it goes on to the engine.

A valid one, and its `tracestate`, go on unchanged (the gateway records no span of its
own). One the specification says to ignore is replaced by a fresh `traceparent` (random
trace-id and parent-id, flags `00`: the gateway recorded nothing) and its `tracestate` is
dropped, as the specification's "restart the trace" asks. Invalid are:

- a version other than two lowercase hex digits, or `ff`;
- version `00` that is not exactly `00-<32 hex>-<16 hex>-<2 hex>` (55 characters), hex in
  lowercase;
- a later version shorter than 55 characters, or whose first four fields are not that
  shape, or whose flags are followed by anything but the end or a dash (its further
  fields are the later version's own);
- a trace-id or parent-id of zeros only;
- more than one `traceparent` header, or one longer than `MAX_TRACEPARENT` characters (no
  version needs that many; a 20 KB value is not passed on).
"""

from __future__ import annotations

import os
import re

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
MAX_TRACEPARENT = 512
"""Characters of a later version's `traceparent` passed on (version 00 has 55)."""

_FIELDS = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_ZERO_TRACE = b"0" * 32
_ZERO_PARENT = b"0" * 16


def valid_traceparent(value: bytes) -> bool:
    """Whether a `traceparent` value is one to pass on (W3C Trace Context level 1, §3.2)."""
    if len(value) > MAX_TRACEPARENT:
        return False
    fields = _FIELDS.match(value)
    if fields is None:
        return False
    version, trace_id, parent_id = fields.groups()
    if version == b"ff" or trace_id == _ZERO_TRACE or parent_id == _ZERO_PARENT:
        return False
    if version == b"00":
        return len(value) == 55
    return len(value) == 55 or value[55:56] == b"-"


def new_traceparent() -> bytes:
    """A fresh trace: random ids, not sampled (the gateway recorded nothing)."""
    trace_id = os.urandom(16).hex()
    parent_id = os.urandom(8).hex()
    return f"00-{trace_id}-{parent_id}-00".encode("ascii")


def checked_trace_context(
    headers: list[tuple[bytes, bytes]],
) -> list[tuple[bytes, bytes]] | None:
    """`headers` with an invalid trace context replaced by a fresh trace, or None when
    they can stay as they are (no `traceparent`, or one valid one)."""
    given = [value for name, value in headers if name == TRACEPARENT]
    if not given or (len(given) == 1 and valid_traceparent(given[0])):
        return None
    kept = [(name, value) for name, value in headers if name not in (TRACEPARENT, TRACESTATE)]
    kept.append((TRACEPARENT, new_traceparent()))
    return kept
