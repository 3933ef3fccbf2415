"""The dashboard's shell: its page and files, and the SSE feed of summary deltas from the fold.

`GET /` and `GET /static/<file>` are plain files shipped in the package (no build step).
`GET /v1/dashboard/events` is a text/event-stream: one `snapshot` event, then one `delta` event
per folded event that changed a shown row (see `services.api.dashboard`); a `rates` event (live
tokens per second by instance, `services.api.dashboard_rates`) after the snapshot and every
`RATES_EVERY_S` they changed; and a comment every `KEEPALIVE_S` while nothing is sent, so proxies
keep the connection. The page reads it with
fetch + ReadableStream rather than EventSource, which cannot send an API key.
"""

from __future__ import annotations

import asyncio
import time
from importlib.resources import files

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from services.api.context import ApiContext
from services.api.dashboard import Delta, Summary
from services.api.dashboard_feed import QUEUE_LIMIT
from services.api.dashboard_rates import Rates
from services.api.schemas import RequestProblem

KEEPALIVE_S = 15.0
RATES_EVERY_S = 1.0
STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


def load_static() -> dict[str, tuple[bytes, str]]:
    """The dashboard's files by name, with their content types: read once, when the app is built."""
    folder = files("services.api") / "static"
    found: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        media_type = STATIC_TYPES.get("." + entry.name.rpartition(".")[2])
        if media_type is not None:
            found[entry.name] = (entry.read_bytes(), media_type)
    return found


def static_response(static: dict[str, tuple[bytes, str]], name: str) -> Response:
    if name not in static:
        raise RequestProblem(404, f"no dashboard file {name!r}", code="not_found")
    body, media_type = static[name]
    return Response(body, media_type=media_type, headers={"cache-control": "no-cache"})


async def dashboard_events(request: Request, ctx: ApiContext) -> Response:
    return DashboardStream(ctx)


def sse_event(kind: str, body: Summary | Delta | Rates) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(body) + b"\n\n"


class DashboardStream(Response):
    media_type = "text/event-stream"

    def __init__(self, ctx: ApiContext) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})
        self._ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async with anyio.create_task_group() as group:
            group.start_soon(self._stream, send)
            while (await receive())["type"] != "http.disconnect":
                pass  # a GET has no body worth reading; wait for the page to go away
            group.cancel_scope.cancel()

    async def _stream(self, send: Send) -> None:
        """The snapshot, then the deltas; subscribed before the snapshot is taken, with no await
        between, so the page misses no delta and gets none the snapshot already holds. The rates
        are looked at every `RATES_EVERY_S` even while deltas keep coming."""
        feed = self._ctx.hub.feed
        with feed.subscribe() as subscription:
            await self._send(send, sse_event("snapshot", feed.snapshot(self._ctx.hub.state)))
            rates = feed.rates()
            await self._send(send, sse_event("rates", Rates(tokens_per_second=rates)))
            next_rates = last_sent = time.monotonic()
            while True:
                if subscription.behind:
                    subscription.queue = asyncio.Queue(QUEUE_LIMIT)
                    subscription.behind = False
                    await self._send(send, sse_event("snapshot", feed.snapshot(self._ctx.hub.state)))
                now = time.monotonic()
                if now >= next_rates:
                    next_rates = now + RATES_EVERY_S
                    if (latest := feed.rates()) != rates:
                        rates = latest
                        await self._send(send, sse_event("rates", Rates(tokens_per_second=rates)))
                        last_sent = now
                    elif now - last_sent >= KEEPALIVE_S:
                        await self._send(send, b": keepalive\n\n")
                        last_sent = now
                delta: Delta | None = None
                with anyio.move_on_after(max(0.0, next_rates - time.monotonic())):
                    delta = await subscription.queue.get()
                if delta is not None:
                    await self._send(send, sse_event("delta", delta))
                    last_sent = time.monotonic()

    @staticmethod
    async def _send(send: Send, body: bytes) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": True})
