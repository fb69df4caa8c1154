"""Child processes of the benchmarks: tied to the parent's life, stopped as a group, and
their logs quoted when they fail."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """`preexec_fn` on Linux: the child gets SIGTERM if the benchmark dies first."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_group(process: asyncio.subprocess.Process, grace_s: float = 5.0) -> None:
    """SIGTERM the process group led by `process`, SIGKILL it after `grace_s`, and kill
    whatever is left in the group either way."""
    signal_group(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), grace_s)
    except TimeoutError:
        signal_group(process.pid, signal.SIGKILL)
        await process.wait()
    signal_group(process.pid, signal.SIGKILL)


def log_tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a child's log, for an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"
