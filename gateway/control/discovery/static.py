"""Pods from a static file (JSON, or TOML by extension), reloaded when it changes or when
asked (`kvgate serve` asks on SIGHUP)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from gateway.config_files import MAX_PODS_FILE_BYTES, read_document
from gateway.control.discovery.base import DiscoveryEvents, PodListener, sync_pods
from gateway.control.discovery.pods import Pod, parse_pods
from gateway.errors import ConfigError

logger = logging.getLogger(__name__)


def load_pods_file(path: Path) -> list[Pod]:
    """Read and validate a pods file (bounded: `gateway/config_files.py`); ConfigError
    names the file and what is wrong."""
    kind = "toml" if path.suffix == ".toml" else "json"
    document = read_document(path, str(path), kind=kind, max_bytes=MAX_PODS_FILE_BYTES)
    return parse_pods(document, source=str(path))


class StaticFileDiscovery:
    """Reports the pods listed in a file; re-reads it when it changes or on `request_reload`.

    A file that becomes invalid is reported and ignored: the last good list stays.
    """

    def __init__(
        self,
        path: Path,
        *,
        poll_interval_s: float = 1.0,
        events: DiscoveryEvents | None = None,
    ) -> None:
        self.path = path
        self._poll_interval_s = poll_interval_s
        self.events = events or DiscoveryEvents()
        self._reload_now = asyncio.Event()
        self.reloads = 0

    def request_reload(self) -> None:
        self._reload_now.set()

    async def run(self, listener: PodListener, ready: asyncio.Event) -> None:
        current: dict[str, Pod] = {}
        stamp = self._stamp()
        await sync_pods(listener, current, load_pods_file(self.path))
        ready.set()
        while True:
            with contextlib.suppress(TimeoutError):  # not wait_for: it can lose a cancel on 3.11
                async with asyncio.timeout(self._poll_interval_s):
                    await self._reload_now.wait()
            forced = self._reload_now.is_set()
            self._reload_now.clear()
            new_stamp = self._stamp()
            if not forced and new_stamp == stamp:
                continue
            stamp = new_stamp
            try:
                pods = load_pods_file(self.path)
            except ConfigError as exc:
                logger.error("pods file not reloaded, keeping the last good list: %s", exc)
                self.events.error(exc)
                continue
            self.reloads += 1
            await sync_pods(listener, current, pods)

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino)
