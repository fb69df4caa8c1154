"""The snapshot directory: one file per pod and the learned cost model's, each replaced
atomically, read back at start-up.

A write goes to a temporary file in the same directory, is fsynced, renamed over the
pod's file and the directory is fsynced: a crash at any point leaves either the old file
or the new one, never a mix (at worst a temporary file, removed at the next start). The
contents are checked by `decode_snapshot` anyway: a disk can still lie.

Blocking calls only: the gateway runs them with `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

SUFFIX = ".kvsnap"
COST_MODEL_FILE = "cost-model.json"
"""The cost model's export (`/admin/cost-model`); never a pod's file (those begin `pod`)."""
_TEMP_SUFFIX = ".tmp"
_MAX_QUOTED = 200  # file names stay well under the usual 255-byte limit


def file_name(pod: str) -> str:
    """The pod's file: its name percent-quoted (so any pod name is a safe, distinct file
    name), or a digest of it when that would be too long."""
    quoted = quote(pod, safe="")
    if len(quoted) <= _MAX_QUOTED:
        return f"pod-{quoted}{SUFFIX}"
    return f"pod={hashlib.sha256(pod.encode()).hexdigest()}{SUFFIX}"  # '=' is never unquoted


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    path: Path
    data: bytes | None
    """None when the file was not read (`error` says why)."""
    error: str | None = None
    """"too_large" or "unreadable"."""


class SnapshotDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._temp_names = itertools.count()

    def prepare(self) -> int:
        """Create the directory if needed; remove temporary files a crash left behind.
        Returns how many were removed."""
        self.path.mkdir(parents=True, exist_ok=True)
        removed = 0
        for final in (f"*{SUFFIX}", COST_MODEL_FILE):
            for leftover in self.path.glob(f".{final}.*{_TEMP_SUFFIX}"):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
                    removed += 1
        return removed

    def read_all(self, max_bytes: int) -> list[SnapshotFile]:
        return [_read(path, max_bytes) for path in sorted(self.path.glob(f"pod*{SUFFIX}"))]

    def read_cost_model(self, max_bytes: int) -> SnapshotFile | None:
        """The cost model's file; None when there is none."""
        path = self.path / COST_MODEL_FILE
        return _read(path, max_bytes) if path.exists() else None

    def write(self, pod: str, data: bytes) -> None:
        """Replace the pod's file with `data`, durably (see the module docstring)."""
        self._replace(self.path / file_name(pod), data)

    def write_cost_model(self, data: bytes) -> None:
        self._replace(self.path / COST_MODEL_FILE, data)

    def _replace(self, final: Path, data: bytes) -> None:
        # Unique per process and write: a write abandoned by a cancelled task may still be
        # running in its thread when the next one starts.
        temp = self.path / f".{final.name}.{os.getpid()}.{next(self._temp_names)}{_TEMP_SUFFIX}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            temp.replace(final)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        self._sync_dir()

    def remove(self, pods: Iterable[str]) -> int:
        """Remove the files of these pods (gone from discovery); returns how many went."""
        removed = 0
        for pod in pods:
            with contextlib.suppress(FileNotFoundError):
                (self.path / file_name(pod)).unlink()
                removed += 1
        if removed:
            self._sync_dir()
        return removed

    def _sync_dir(self) -> None:
        """Make renames and removals durable: they live in the directory's own blocks."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _read(path: Path, max_bytes: int) -> SnapshotFile:
    try:
        if path.stat().st_size > max_bytes:
            return SnapshotFile(path, None, "too_large")
        return SnapshotFile(path, path.read_bytes())
    except OSError:
        return SnapshotFile(path, None, "unreadable")
