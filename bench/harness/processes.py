"""Child processes of the benchmarks: tied to the parent's life, stopped as a group, and
their logs quoted when they fail.

Every child runs in its own session (a Ctrl-C in the terminal reaches the benchmark only,
which then stops things in order) and, on Linux, gets SIGTERM if the benchmark dies first
(`PR_SET_PDEATHSIG`). Its output goes to a log file, or its stdout to a pipe the caller
reads (engines print their addresses there).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1
_LINE_LIMIT = 64 * 2**20
"""The longest stdout line `readline()` reads (an answer may be a whole cache's hashes)."""


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """`preexec_fn` on Linux: the child gets SIGTERM if the benchmark dies first."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def pinned(cpus: Collection[int]) -> Callable[[], None]:  # pragma: no cover - in the child
    """`preexec_fn` on Linux: `die_with_parent()`, and the child (with every process it
    starts later, which inherit the mask) runs on `cpus` only."""
    mask = frozenset(cpus)

    def preexec() -> None:
        die_with_parent()
        os.sched_setaffinity(0, mask)

    return preexec


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def log_tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a child's log, for an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def cpu_seconds(pid: int | None, *, with_children: bool = False) -> float | None:
    """User + system CPU seconds of `pid` (and, `with_children`, of its reaped children)
    from /proc (10 ms resolution); None when unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    used = fields[11:15] if with_children else fields[11:13]
    return sum(int(f) for f in used) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None


class ChildProcess:
    """One child process, started again as often as wanted (`starts` counts the spawns).

    `stop()` is a clean shutdown: `stop_signal` to its process group, SIGKILL after the
    grace period, and whatever is left in the group killed either way; `kill()` is a crash
    (SIGKILL). Both are idempotent.
    """

    def __init__(self, name: str, log_path: Path, *, stop_signal: int = signal.SIGTERM) -> None:
        self.name = name
        self.log_path = log_path
        self.stop_signal = stop_signal
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self._log: IO[bytes] | None = None
        self._drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        """The pid while the process runs."""
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    @property
    def exited(self) -> bool:
        return self.proc is None or self.proc.returncode is not None

    async def spawn(
        self,
        command: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        pipe: bool = False,
        stdin: bool = False,
        cpus: Collection[int] | None = None,
    ) -> None:
        """Start `command`; `env` is added to this process's environment; `pipe`: its stdout
        is read with `readline()` (then `follow()`), else it goes to the log like stderr;
        `stdin`: lines are written to it with `write_line()`; `cpus`: the only CPUs it and
        its own children may run on (Linux)."""
        await self.stop()
        await asyncio.to_thread(self.log_path.parent.mkdir, parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE if pipe else self._log,
            stderr=self._log,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
            preexec_fn=self._preexec(cpus),
            limit=_LINE_LIMIT,
        )
        self.starts += 1

    @staticmethod
    def _preexec(cpus: Collection[int] | None) -> Callable[[], None] | None:
        if sys.platform != "linux":
            return None
        return die_with_parent if cpus is None else pinned(cpus)

    async def readline(self) -> str:
        """The next line of the piped stdout ('' at its end)."""
        assert self.proc is not None and self.proc.stdout is not None
        return (await self.proc.stdout.readline()).decode(errors="replace")

    async def write_line(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    def follow(self) -> None:
        """Keep reading the piped stdout (unread, a full pipe would block the child)."""
        assert self.proc is not None and self.proc.stdout is not None
        stdout = self.proc.stdout

        async def drain() -> None:
            while await stdout.readline():
                pass

        self._drain = asyncio.create_task(drain(), name=f"{self.name}-stdout")

    async def wait(self) -> int:
        """Until the process exits; its exit code (it is killed if this wait is cancelled)."""
        assert self.proc is not None
        try:
            return await self.proc.wait()
        except BaseException:
            await self.kill()
            raise

    def cpu_seconds(self, *, with_children: bool = False) -> float | None:
        return cpu_seconds(self.pid, with_children=with_children)

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    async def stop(self, grace_s: float = 5.0, sig: int | None = None) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            signal_group(proc.pid, self.stop_signal if sig is None else sig)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
            signal_group(proc.pid, signal.SIGKILL)
        await self._close()

    async def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
        await self._close()

    async def _close(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
        if self._log is not None:
            self._log.close()
            self._log = None
