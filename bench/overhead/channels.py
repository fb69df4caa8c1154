"""The load generator's clients: sequential requests to one server over one keep-alive
connection, timed from send to first body bytes and to the end of the answer.

`RawChannel` (`--client raw`, ~0.1 ms of CPU per request) is a minimal HTTP/1.1 client on
asyncio streams; `HttpxChannel` (`--client httpx`) costs ~1 ms per request at concurrency
1 and ~5 ms at 64 (its pool scans every connection on each request).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import httpx

PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Timing:
    first_s: float
    """Request sent → first body bytes (the first SSE chunk of a stream)."""
    total_s: float
    status: int


class Channel(Protocol):
    """Sequential requests to one server over one keep-alive connection."""

    async def post(self, body: bytes, policy: str, path: str = PATH) -> Timing: ...

    async def close(self) -> None: ...


ChannelFactory = Callable[[str], Channel]


class RawChannel:
    """A minimal HTTP/1.1 keep-alive client (content-length and chunked bodies)."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self._host, self._port = host, int(port)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes, policy: str, path: str = PATH) -> Timing:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self._host}:{self._port}\r\n"
            f"content-type: application/json\r\nx-kvgate-policy: {policy}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        started = time.perf_counter()
        self._writer.write(head + body)
        status, first = await _read_response(self._reader)
        return Timing(first - started, time.perf_counter() - started, status)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, float]:
    """Reads one response; returns its status and when its first body bytes arrived."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
        return status, time.perf_counter()
    first = 0.0
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        await reader.readexactly(size + 2)
        first = first or time.perf_counter()
    await reader.readuntil(b"\r\n")
    return status, first or time.perf_counter()


class HttpxChannel:
    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self._client = client
        self._url = url

    async def post(self, body: bytes, policy: str, path: str = PATH) -> Timing:
        headers = {"content-type": "application/json", "x-kvgate-policy": policy}
        started = time.perf_counter()
        first = 0.0
        url = self._url + path
        async with self._client.stream("POST", url, content=body, headers=headers) as r:
            async for _ in r.aiter_raw():
                first = first or time.perf_counter()
        ended = time.perf_counter()
        return Timing((first or ended) - started, ended - started, r.status_code)

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def client_factory(kind: str) -> AsyncIterator[ChannelFactory]:
    if kind == "raw":
        yield RawChannel
        return
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
        yield lambda url: HttpxChannel(client, url)
