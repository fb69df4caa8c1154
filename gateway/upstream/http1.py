"""A small keep-alive HTTP/1.1 client for the proxy's hot path: asyncio protocols and the
httptools response parser (the C parser uvicorn uses).

Why not httpx here: its connection pool re-scans every pooled connection on each request
and each response close, which made it most of the gateway's CPU at 32+ requests in flight
(`kvgate bench overhead`). The proxy needs far less than a general client: POST a body it
already holds to a known origin, get the status and headers, then the body chunks as they
arrive, with a connect timeout, a timeout on each wait for the engine, and the connection
back in a per-origin idle stack when the response ended cleanly.

Each `Exchange` is one request on one connection. `abort` ends it from outside (the client
went away): the connection is closed, so the engine sees the disconnect and stops.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

Headers = list[tuple[bytes, bytes]]

_HIGH_WATER = 256 * 1024
# Bounds on an engine's response header section: vLLM and SGLang send a handful of headers
# at once; anything beyond these is a broken or hostile engine (502, retried elsewhere).
_MAX_HEADERS = 100
_MAX_HEADER_BYTES = 64 * 1024
_HEADER_DEADLINE_S = 10.0
"""Buffered body bytes at which reading from the engine pauses (the client is slower)."""


class Http1Error(Exception):
    """The exchange failed; `before_response` says whether no byte of an answer came."""

    before_response = False


class ConnectFailed(Http1Error):
    """No connection, or it closed before any byte of the answer (the engine never saw it
    or dropped it unanswered): safe to send elsewhere."""

    before_response = True


class ResponseTimeout(Http1Error):
    """The engine sent nothing for the read timeout."""


class ResponseBroken(Http1Error):
    """The connection failed or the answer was not valid HTTP after it started."""


class Aborted(Http1Error):
    """Ended by our side (`Exchange.abort`)."""


@dataclass(frozen=True, slots=True)
class Origin:
    host: str
    port: int
    host_header: bytes
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> tuple[Origin, bytes]:
        """The origin of an http(s) URL, and its path (b"" for none)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s)://host[:port] URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = parts.path.rstrip("/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.hostname, port, parts.netloc.encode("ascii"), tls), path.encode()


class _Connection(asyncio.Protocol):
    """One TCP connection; carries one exchange at a time."""

    def __init__(self, origin: Origin, on_lost: Callable[[_Connection], None]) -> None:
        self.origin = origin
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._exchange: Exchange | None = None
        self.closed = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.attach(transport)

    def attach(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        exchange.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._exchange is not None:
            self._exchange.lost()
        self._on_lost(self)

    def pause_reading(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.resume_reading()

    # -- ours ------------------------------------------------------------------------
    def start(self, exchange: Exchange, data: bytes) -> None:
        assert self._transport is not None
        self._exchange = exchange
        self._transport.write(data)

    def finish(self) -> None:
        self._exchange = None

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class Exchange:
    """One request/response on a connection: status and headers, then body chunks."""

    def __init__(
        self,
        pool: Http1Pool,
        connection: _Connection,
        *,
        reused: bool,
        read_timeout_s: float,
        header_deadline_s: float = _HEADER_DEADLINE_S,
    ) -> None:
        self._pool = pool
        self._header_deadline_s = header_deadline_s
        self._connection = connection
        self.reused = reused
        self._read_timeout_s = read_timeout_s
        self._parser = httptools.HttpResponseParser(self)
        self._loop = asyncio.get_running_loop()
        self._headers_done: asyncio.Future[None] = self._loop.create_future()
        self._waiter: asyncio.Future[None] | None = None
        self._waiting_since = 0.0
        self._read_timer: asyncio.TimerHandle | None = None
        """One timer per exchange checks every wait for body bytes, re-armed only when it
        fires (a timer made and cancelled per chunk cost ~3.5 µs of each relayed chunk)."""
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._answered = False
        self._length_delimited = False
        self.fixed_length = False
        """The answer's length is declared (`content-length`): a whole answer, not a stream."""
        self._error: Http1Error | None = None
        self._released = False
        self.status = 0
        self.headers: Headers = []
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self.complete = False
        self.keep_alive = False
        self.on_release: Callable[[Exchange], None] | None = None
        """Hears of the exchange's end (`release`, which every exchange reaches once): who
        keeps a book of exchanges in progress takes it out there."""

    # -- httptools callbacks (inside feed) ------------------------------------------------
    def on_message_begin(self) -> None:
        self._answered = True

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            self._length_delimited = True
            self.fixed_length = self.fixed_length or lowered == b"content-length"
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > _MAX_HEADER_BYTES or len(self.headers) >= _MAX_HEADERS:
            self._fail(ResponseBroken(
                f"the engine's response headers exceed {_MAX_HEADERS} headers or "
                f"{_MAX_HEADER_BYTES} bytes"
            ))  # fmt: skip
            return
        self.headers.append((lowered, value))

    def _headers_too_slow(self) -> None:
        if not self._headers_done.done():
            self._fail(ResponseBroken(
                f"the engine's response headers took more than {self._header_deadline_s:g} s"
            ))  # fmt: skip

    def on_headers_complete(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        if not self._headers_done.done():
            self._headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered >= _HIGH_WATER and not self._paused:
            self._paused = True
            self._connection.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- connection events -------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.complete:  # more than one answer: the engine broke the protocol
            self._fail(ResponseBroken("bytes after the end of the response"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ResponseBroken(f"invalid HTTP response: {exc}"))
            return
        if self._answered and self._header_timer is None and not self._headers_done.done():
            # The status line came but not all the headers: the header section has a
            # deadline of its own (the read timeout, which may be long for a non-streamed
            # answer, is per wait). Headers that arrive whole, as engines send them, need
            # no timer.
            self._header_timer = self._loop.call_later(
                self._header_deadline_s, self._headers_too_slow
            )

    def lost(self) -> None:
        if self.complete:
            return
        if self._headers_done.done() and not self._length_delimited:
            self.complete = True  # a body delimited by the end of the connection
            self.keep_alive = False
            self._wake()
        elif not self._answered:
            self._fail(ConnectFailed("the connection closed before any answer"))
        else:
            self._fail(ResponseBroken("the connection closed in the middle of the answer"))

    def break_off(self, reason: str) -> bool:
        """End an exchange still in progress as broken (its pod is gone): a waiter for the
        headers or the next chunk gets ResponseBroken. A finished exchange is left alone.
        True when it was broken off (it was in progress, and its caller will see the error)."""
        if self.complete or self._released or self._error is not None:
            return False
        self._fail(ResponseBroken(reason))
        return True

    def abort(self, reason: str = "aborted") -> None:
        """End the exchange now (from any task): close the connection, wake any waiter."""
        if not self.complete:
            self._fail(Aborted(reason))
        self.release()

    def _fail(self, error: Http1Error) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        if self._error is None:
            self._error = error
        self._connection.close()
        if not self._headers_done.done():
            self._headers_done.set_exception(error)
            self._headers_done.exception()  # retrieved: nobody may be waiting any more
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the caller's side --------------------------------------------------------------
    async def response(self) -> None:
        """Wait for the status line and headers (a timer, not `asyncio.timeout`: the
        timeout fails the exchange, which wakes this wait with ResponseTimeout)."""
        timer = self._loop.call_later(self._read_timeout_s, self._on_response_timeout)
        try:
            await self._headers_done
        finally:
            timer.cancel()

    def _on_response_timeout(self) -> None:
        if not self._headers_done.done():
            self._fail(ResponseTimeout(f"no answer within {self._read_timeout_s} s"))

    def take_body(self) -> bytes:
        """Everything buffered so far (the whole body once `complete`)."""
        body = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return body

    async def body_started(self) -> None:
        """Until the first body bytes (or the end of the answer) are here."""
        while not self._chunks and not self.complete:
            if self._error is not None:
                raise self._error
            await self._wait_for_more()

    @property
    def drained(self) -> bool:
        """The answer has ended and every chunk of it was taken: the last one taken (from
        `chunks`) was its end."""
        return self.complete and not self._chunks

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body chunks as the engine sends them."""
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered < _HIGH_WATER // 2:
                    self._paused = False
                    self._connection.resume_reading()
                yield chunk
            if self.complete:
                return
            if self._error is not None:
                raise self._error
            await self._wait_for_more()

    async def _wait_for_more(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        self._waiting_since = now = self._loop.time()
        if self._read_timer is None:
            self._read_timer = self._loop.call_at(now + self._read_timeout_s, self._check_read)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_read(self) -> None:
        """The read timer fired: fail a wait that has lasted the read timeout, or check
        again when the current wait would reach it (no wait: the timer rests until one)."""
        self._read_timer = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self._released:
            return
        due = self._waiting_since + self._read_timeout_s
        if self._loop.time() >= due:
            self._fail(ResponseTimeout(f"the engine sent nothing for {self._read_timeout_s} s"))
        else:
            self._read_timer = self._loop.call_at(due, self._check_read)

    def release(self) -> None:
        """Give the connection back (kept alive if the answer ended cleanly), once."""
        if self._released:
            return
        self._released = True
        if self.on_release is not None:
            self.on_release(self)
            self.on_release = None
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        self._connection.finish()
        reusable = self.complete and self.keep_alive and self._error is None
        self._pool.put_back(self._connection, reusable=reusable)


class Http1Pool:
    """Keep-alive connections per origin: idle ones are reused most recent first."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_idle_per_origin: int = 256,
        idle_expiry_s: float = 4.0,
        header_deadline_s: float = _HEADER_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._header_deadline_s = header_deadline_s
        self._read_timeout_s = read_timeout_s
        self._max_idle = max_idle_per_origin
        # Below the engines' own keep-alive timeout (uvicorn's default is 5 s), so the
        # engine rarely closes a connection just as a request is sent on it.
        self._idle_expiry_s = idle_expiry_s
        self._clock = clock
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._targets: dict[str, tuple[Origin, bytes]] = {}
        self._tls: ssl.SSLContext | None = None

    def target(self, url: str) -> tuple[Origin, bytes]:
        """`url` as (origin, path), parsed once per distinct URL."""
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) > 10_000:  # URLs come from discovery, but stay bounded
                self._targets.clear()
            target = self._targets[url] = Origin.parse(url)
        return target

    async def post(
        self, url: str, body: bytes, *, content_type: bytes = b"application/json"
    ) -> tuple[int, bytes]:
        """POST `body` to `url` and read the whole answer: (status, body)."""
        origin, path = self.target(url)
        head = b"POST %s HTTP/1.1\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
            path or b"/", content_type, len(body))  # fmt: skip
        exchange = await self.send(url, head, body, origin=origin)
        try:  # a small answer arrives whole with its headers
            answer = exchange.take_body() if exchange.complete else await exchange.read()
        finally:
            exchange.release()
        return exchange.status, answer

    async def send(
        self,
        url: str,
        head: bytes,
        body: bytes,
        *,
        on_exchange: Callable[[Exchange], None] | None = None,
        origin: Origin | None = None,
    ) -> Exchange:
        """Send `head` (request line and headers, without Host) and `body` to the origin of
        `url`; returns once the engine's status and headers arrived. `on_exchange` hears of
        the exchange as soon as the request is sent (to abort it from elsewhere).

        A reused connection that turns out to be closed is replaced, transparently."""
        if origin is None:
            origin = self.target(url)[0]
        data = b"".join((head, b"host: ", origin.host_header, b"\r\n\r\n", body))
        while True:
            connection, reused = await self._checkout(origin)
            exchange = Exchange(
                self,
                connection,
                reused=reused,
                read_timeout_s=self._read_timeout_s,
                header_deadline_s=self._header_deadline_s,
            )
            connection.start(exchange, data)
            if on_exchange is not None:
                on_exchange(exchange)
            try:
                await exchange.response()
            except ConnectFailed:
                exchange.release()
                if reused:
                    continue
                raise
            except BaseException:
                exchange.abort("cancelled")
                raise
            return exchange

    async def _checkout(self, origin: Origin) -> tuple[_Connection, bool]:
        idle = self._idle.get(origin)
        now = self._clock()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < self._idle_expiry_s:
                return connection, True
            connection.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                transport, connection = await loop.create_connection(
                    lambda: _Connection(origin, self._forget),
                    origin.host,
                    origin.port,
                    ssl=self._tls_context() if origin.tls else None,
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {exc!r}") from None
        connection.attach(transport)  # uvloop may call connection_made only later
        self._open.add(connection)
        return connection, False

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def put_back(self, connection: _Connection, *, reusable: bool) -> None:
        if not reusable or connection.closed:
            connection.close()
            return
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) >= self._max_idle:
            connection.close()
            return
        connection.idle_since = self._clock()
        idle.append(connection)

    def _forget(self, connection: _Connection) -> None:
        self._open.discard(connection)
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._idle.clear()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)  # let the transports finish closing
