"""One access log line per HTTP request: method, route, status, the caller's key id (never the
key), the task it created, and how long the whole response took (a stream's included).

An ASGI middleware, outermost but for the server's own error layer, so a refusal by the browser
guard or a 404 gets its line too. The route is the name `app.bind` gave it (`chat`, `messages`,
...), or its endpoint's name, or `unmatched`: never the raw path, which a client chooses.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from loguru import logger
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.auth import caller_in

ROUTE_KEY = "shoal.route"  # the request scope's key for the route's name (`app.bind` sets it)
TASK_HEADER = b"x-shoal-task-id"


@dataclass(frozen=True, slots=True)
class AccessRecord:
    method: str
    route: str
    status: int  # 0: no response was started (the connection went first)
    key_id: str  # "" for no key (an open API or an open route)
    task_id: str  # "" for a request that created no task
    duration_ms: float

    def line(self) -> str:
        key = self.key_id or "-"
        task = self.task_id or "-"
        return f"{self.method} {self.route} {self.status} key={key} task={task} {self.duration_ms:.1f} ms"


def route_of(scope: Scope) -> str:
    named = scope.get(ROUTE_KEY)
    if isinstance(named, str):
        return named
    endpoint = scope.get("endpoint")
    return getattr(endpoint, "__name__", "unmatched") if endpoint is not None else "unmatched"


class AccessLog:
    """Logs an `AccessRecord` (bound as `access`, so a JSON line carries its fields) per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status, task_id = 0, ""

        async def sending(message: Message) -> None:
            nonlocal status, task_id
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for name, value in message.get("headers", []):
                    if name.lower() == TASK_HEADER:
                        task_id = bytes(value).decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            caller = caller_in(scope)
            record = AccessRecord(
                method=str(scope["method"]),
                route=route_of(scope),
                status=status,
                key_id=caller.key_id if caller is not None else "",
                task_id=task_id,
                duration_ms=(time.perf_counter() - started) * 1000,
            )
            logger.bind(access=dataclasses.asdict(record)).info("{}", record.line())
