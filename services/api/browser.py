"""What a web page could make a browser send to the API, refused before any route runs.

An API on loopback is still reachable from every page the user's browser opens. Three rules
close the ways in, whether or not API keys are configured:
- DNS rebinding: a page on evil.example whose name is made to resolve to 127.0.0.1 reaches the
  API as same-origin, but its requests still say `Host: evil.example`; on a loopback bind, only
  the bound address and the loopback names are accepted.
- Forged requests: a page may POST a form (or text/plain) anywhere without asking first; a body
  must be `application/json`, which a page can only send after a CORS preflight. A POST with no
  body and no content type (cancelling a task) carries nothing a form could forge.
- CORS: off unless `cors_origins` lists the origins; a preflight from any other origin is
  refused here with a JSON error, and allowed ones are answered by Starlette's CORSMiddleware.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.anthropic_errors import ANTHROPIC_PATHS, anthropic_error_for
from services.api.auth import Refusal, is_loopback

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class BrowserRules:
    bound_host: str
    cors_origins: tuple[str, ...]

    def refusal(self, method: str, headers: Headers) -> Refusal | None:
        return self._host(headers) or self._preflight(method, headers) or self._content_type(method, headers)

    def _host(self, headers: Headers) -> Refusal | None:
        host = headers.get("host")
        if host is None or not is_loopback(self.bound_host):
            return None
        if hostname(host) in LOOPBACK_NAMES | {self.bound_host.lower()}:
            return None
        message = f"Host {host!r} is not this API's address: an API bound to {self.bound_host} answers only to it"
        return Refusal(400, message, "host_not_allowed")

    def _preflight(self, method: str, headers: Headers) -> Refusal | None:
        origin = headers.get("origin")
        if method != "OPTIONS" or origin is None or "access-control-request-method" not in headers:
            return None
        if origin in self.cors_origins:
            return None
        allowed = ", ".join(self.cors_origins) or "none"
        message = f"cross-origin requests from {origin} are not allowed (cors_origins: {allowed})"
        return Refusal(403, message, "cors_origin_not_allowed")

    def _content_type(self, method: str, headers: Headers) -> Refusal | None:
        if method != "POST":
            return None
        declared = headers.get("content-type")
        if declared is None and headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers:
            return None
        if declared is not None and declared.partition(";")[0].strip().lower() == "application/json":
            return None
        message = f"send the body as JSON with `Content-Type: application/json` (got {declared or 'none'})"
        return Refusal(415, message, "unsupported_media_type")


def hostname(host: str) -> str:
    """The name in a Host header, without its port: `[::1]:8000` -> `::1`, `Example:80` -> `example`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class BrowserGuard:
    """ASGI middleware applying `BrowserRules` to every HTTP request."""

    def __init__(self, app: ASGIApp, rules: BrowserRules) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.rules.refusal(scope["method"], Headers(scope=scope))
            if refusal is not None:
                anthropic = str(scope["path"]).startswith(ANTHROPIC_PATHS)  # that API's clients read its shape
                response = anthropic_error_for(refusal.problem()) if anthropic else refusal.response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
