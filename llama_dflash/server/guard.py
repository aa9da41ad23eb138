"""Checks every HTTP request passes before it reaches a route (pure ASGI middleware).

In order: the Host header when bound to loopback (a web page that rebinds its own DNS name to
127.0.0.1 sends its own name: 421), the API key on every path but /health (401), a JSON
Content-Type on requests with a body (a page's cross-site form or `text/plain` fetch: 415), and
the body size (413, from Content-Length or while the body is read).  Pure ASGI rather than
Starlette's BaseHTTPMiddleware so that streamed replies and client disconnects pass straight
through.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Awaitable, Callable, Collection, Optional

from .errors import APIError, error_body

__all__ = ["RequestGuard", "loopback_hosts", "LOOPBACK"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def loopback_hosts(port: int) -> frozenset[str]:
    """Host header values a browser sends for this server on loopback (with or without the port)."""
    names = ("localhost", "127.0.0.1", "[::1]")
    return frozenset(names) | frozenset(f"{n}:{port}" for n in names)


async def send_error(send: Send, status: int, message: str, code: Optional[str] = None,
                     headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps(error_body(status, message, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    def __init__(self, app: Callable[..., Awaitable[None]], *, api_key: Optional[str] = None,
                 allowed_hosts: Optional[Collection[str]] = None, max_body_bytes: int = 1 << 20,
                 open_paths: Collection[str] = ("/health",)):
        if api_key is not None and not api_key.strip():
            raise ValueError("the API key must not be empty")
        self.app = app
        self.api_key = api_key.encode() if api_key is not None else None
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts) if allowed_hosts is not None else None
        self.max_body_bytes = max_body_bytes
        self.open_paths = frozenset(open_paths)

    def _key_ok(self, headers: dict[bytes, bytes]) -> bool:
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        return secrets.compare_digest(given, self.api_key or b"")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", ()):
            name = name.lower()
            if name in headers and name in (b"host", b"content-length", b"authorization", b"content-type"):
                await send_error(send, 400, f"duplicate {name.decode()} header")
                return
            headers[name] = value
        if self.allowed_hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1").lower()
            if host not in self.allowed_hosts:
                await send_error(send, 421, "this server answers to localhost only (Host header refused)",
                                 code="invalid_host")
                return
        if self.api_key is not None and scope.get("path") not in self.open_paths and not self._key_ok(headers):
            await send_error(send, 401, "invalid or missing API key (Authorization: Bearer KEY)",
                             code="invalid_api_key", headers=((b"www-authenticate", b"Bearer"),))
            return
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if media != b"application/json":
                await send_error(send, 415, "the body must be JSON sent as Content-Type: application/json",
                                 code="unsupported_media_type")
                return
            length = headers.get(b"content-length")
            if length is not None:
                if not length.isdigit() or len(length) > 18:
                    await send_error(send, 400, "invalid Content-Length header")
                    return
                if int(length) > self.max_body_bytes:
                    await send_error(send, 413, f"the body is larger than {self.max_body_bytes} bytes",
                                     code="body_too_large")
                    return
            receive = self._bounded(receive)
        await self.app(scope, receive, send)

    def _bounded(self, receive: Receive) -> Receive:
        """`receive` that refuses a body (chunked, or longer than announced) over the limit."""
        seen = 0

        async def bounded() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise APIError(413, f"the body is larger than {self.max_body_bytes} bytes", code="body_too_large")
            return message

        return bounded
