"""The gateway's outermost ASGI layer: which port serves which path, and a response cut
short by its engine ending the client's connection unfinished."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import NotFound, clip
from gateway.http.request_id import RequestIds
from gateway.upstream.proxy import ClientGone, UpstreamCut


class CutConnections:
    """An engine failure after the response started ends it unfinished: uvicorn then drops
    the client's connection, as the engine's own failure would have. Inside it, request ids
    and the access log (`gateway/http/request_id.py`) wrap the whole app, errors included;
    then the forwarded client address (with `KVGATE_TRUSTED_PROXIES`,
    `gateway/http/client_address.py`), the concurrency limit, then the generation lane
    (`api.GenerationLane`) in front of the starlette app that serves every other route."""

    def __init__(
        self,
        app: ASGIApp,
        starlette: Starlette,
        *,
        access_log: bool = True,
        admin_port: int | None = None,
        on_invalid_header: Callable[[str], None] | None = None,
    ) -> None:
        self.app = RequestIds(app, access_log=access_log, on_invalid=on_invalid_header)
        self.state = starlette.state  # the gateway state, for embedding code and tests
        self.admin_port = admin_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.admin_port is not None and scope["type"] == "http" and not self._on_its_port(scope):
            await _not_here(scope, receive, send)
            return
        with contextlib.suppress(UpstreamCut, ClientGone):
            await self.app(scope, receive, send)

    def _on_its_port(self, scope: Scope) -> bool:
        """With KVGATE_ADMIN_PORT, /metrics and /admin/* live there and only there."""
        server = scope.get("server")
        on_admin_port = server is not None and server[1] == self.admin_port
        path: str = scope.get("path", "")
        operator = path == "/metrics" or path == "/admin" or path.startswith("/admin/")
        return operator == on_admin_port or path in ("/health", "/ready")


async def _not_here(scope: Scope, receive: Receive, send: Send) -> None:
    """404 in OpenAI's shape: this path is served on the other port."""
    error = NotFound(f"{clip(str(scope.get('path')))} is not served on this port")
    await error.response()(scope, receive, send)
