"""uvicorn's httptools protocol with the two bounds it lacks: header size and header time.

uvicorn's h11 protocol refuses a request whose headers exceed 16 KiB, but the httptools
one (the C parser kvgate uses for speed) accepts headers of any size and waits forever for
headers that never end: one slow client could hold a connection, or memory, without
limit. This subclass answers 431 when a request's URL + headers exceed `max_header_bytes`,
and closes a connection that has not completed a request's headers within
`header_timeout_s` (from its opening, or from the start of each request on a kept-alive
connection). The request body's own deadline is the app's (`KVGATE_BODY_TIMEOUT`); a
connection whose request was answered before its body was all received is closed after
the answer.

It also tells the app when the client's connection closes, through the scope extension
`CLIENT_GONE` (a `ConnectionWatch`): the proxy hears of a client leaving from the protocol
itself instead of keeping a task per request blocked in `receive()` for the disconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

CLIENT_GONE = "kvgate.client_gone"
"""The scope extension holding the request's `ConnectionWatch`."""
BODY_RECEIVED = "kvgate.body_received"
"""The scope extension set (True) once the request's whole body has been received: reading
it then cannot wait on the client, so it needs no deadline."""


class ConnectionWatch:
    """One client connection: `closed` once it is lost, and who wants to hear of it."""

    __slots__ = ("_callbacks", "closed")

    def __init__(self) -> None:
        self.closed = False
        self._callbacks: list[Callable[[], None]] = []

    def subscribe(self, callback: Callable[[], None]) -> None:
        """`callback` is called once when the connection is lost (not if it already is)."""
        self._callbacks.append(callback)

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def lost(self) -> None:
        self.closed = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class Writable(Protocol):
    """What a response cycle uses of its transport."""

    def write(self, data: bytes) -> None: ...
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...


class HeadWithBody:
    """The transport a response is written through: its first write (the response head)
    waits until the end of this event-loop iteration, and goes out in one write with the
    body's first bytes if they come by then.

    An answer relayed whole from an engine is one write, not two: on loopback or a pod
    network each write is a send system call and often a packet of its own, the largest
    single cost of a small request in the gateway's CPU (`kvgate bench overhead`). A stream's
    head goes out at the end of the iteration as before; nothing else is held. `close`
    (the transport's own by default) is called once what is held went out."""

    __slots__ = ("_close", "_flush", "_held", "_loop", "_started", "_transport")

    def __init__(
        self,
        transport: Writable,
        loop: asyncio.AbstractEventLoop,
        close: Callable[[], None] | None = None,
    ) -> None:
        self._transport = transport
        self._loop = loop
        self._close = close or transport.close
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._release()
            self._transport.write(held + data)
        elif self._started:
            self._transport.write(data)
        else:
            self._started = True
            self._held = data
            self._flush = self._loop.call_soon(self._write_held)

    def _release(self) -> None:
        self._held = None
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None

    def _write_held(self) -> None:
        held = self._held
        self._release()
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._write_held()
        self._close()


LINGER_S = 2.0
"""How long a connection answered before its request's body was complete goes on reading
(and dropping) that body before it is closed."""


class HeaderTooLarge(Exception):
    """Raised from the parser callback to stop parsing an oversized request."""


_RESPONSE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 31\r\n"
    b"connection: close\r\n"
    b"\r\n"
    b"Request header fields too large"
)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = 32 * 1024
    header_timeout_s = 10.0
    linger_s = LINGER_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._header_overflow = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._headers_pending = False
        self._watch = ConnectionWatch()
        self._linger_timer: asyncio.TimerHandle | None = None
        self._rest_of_body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        for timer in (self._linger_timer, self._rest_of_body_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)
        self._watch.lost()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope["extensions"] = {**scope.get("extensions", {}), CLIENT_GONE: self._watch}
        self._header_bytes = 0
        # The request's headers are due header_timeout_s from now: timed only if they do
        # not all arrive in this read (`data_received`), as clients send them.
        self._cancel_header_timer()
        self._headers_pending = True

    def on_message_complete(self) -> None:
        if self._rest_of_body_timer is not None:  # the rest came in time: keep-alive holds
            self._rest_of_body_timer.cancel()
            self._rest_of_body_timer = None
        super().on_message_complete()
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope["extensions"][BODY_RECEIVED] = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not self.transport.is_closing():
            # Answered before the request's body was all here (a route that reads no body,
            # a 401): uvicorn reads and drops the rest, and the connection stays open for
            # the client's next request, as the answer told it. A client still trickling
            # that body after `linger_s` must not hold the connection: it is closed then.
            # Not at once: the answer said keep-alive, and a client sending its next
            # request on this connection would lose it.
            close = cycle.transport.close  # through the HeadWithBody: what it holds first
            self._rest_of_body_timer = self.loop.call_later(self.linger_s, close)

    def _close_after_answer(self) -> None:
        """The connection closes after an answer. If the request's body is still arriving
        (408, 413, 429), it lingers: our side is shut, and what the client still sends is
        read and dropped until it stops or for `linger_s`. Closed at once, the unread
        bytes would make the kernel reset the connection, and a client still writing
        could lose the answer before reading it."""
        cycle = self.cycle
        transport = self.transport
        if cycle is None or not cycle.more_body or transport.is_closing():
            transport.close()
            return
        if self._linger_timer is not None:
            return
        self._linger_timer = self.loop.call_later(self.linger_s, transport.close)
        self.flow.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None:
            return  # the rest of a refused request: dropped
        super().data_received(data)
        pending = self._headers_pending and self._header_timer is None
        if pending and not self.transport.is_closing():
            self._start_header_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4  # ": " and CRLF, as on the wire
        if self._header_bytes > self.max_header_bytes:
            self._count(0)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._headers_pending = False
        self._cancel_header_timer()
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not before and cycle is not None:
            # A new request (not an upgrade): its response goes out through a HeadWithBody.
            # Its task has not run yet, so nothing was written through the plain one.
            cycle.transport = HeadWithBody(  # type: ignore[assignment]
                cycle.transport, self.loop, self._close_after_answer
            )

    def send_400_response(self, msg: str) -> None:
        # The parser reports our callback's exception as a parse error: answer 431 instead.
        if self._header_overflow:
            self.transport.write(_RESPONSE_431)
            self.transport.close()
            return
        super().send_400_response(msg)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.max_header_bytes:
            self._header_overflow = True
            raise HeaderTooLarge(f"request headers exceed {self.max_header_bytes} bytes")

    def _start_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(
    *, max_header_bytes: int, header_timeout_s: float
) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for `uvicorn.Config(http=...)` with these bounds."""
    return type(
        "BoundedHttpToolsProtocol",
        (BoundedHttpToolsProtocol,),
        {"max_header_bytes": max_header_bytes, "header_timeout_s": header_timeout_s},
    )
