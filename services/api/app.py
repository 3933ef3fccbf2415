"""The Starlette app and the API service that serves it next to its log follower."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvicorn
from loguru import logger
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from eventlog.connect_options import ConnectOptions
from eventlog.log import EventLog
from services.api import chat, routes
from services.api.context import ApiContext
from services.api.openapi import openapi_document
from services.api.schemas import RequestProblem
from services.api.timeline import timeline_page
from services.config import ResolvedConfig, log_settings

Handler = Callable[[Request, ApiContext], Awaitable[Response]]


def build_app(ctx: ApiContext) -> Starlette:
    def bind(name: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                response = await handler(request, ctx)
            except RequestProblem as problem:
                response = chat.problem_response(problem)
            ctx.metrics.requests[(name, response.status_code)] += 1
            return response

        return endpoint

    document = openapi_document()

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    route_table = [
        Route("/v1/chat/completions", bind("chat", chat.chat_completions), methods=["POST"]),
        Route("/v1/models", bind("models", routes.list_models), methods=["GET"]),
        Route("/v1/tasks/{task_id}", bind("task", routes.get_task), methods=["GET"]),
        Route("/v1/tasks/{task_id}/cancel", bind("cancel", routes.cancel_task), methods=["POST"]),
        Route("/v1/config", bind("config", routes.get_config), methods=["GET"]),
        Route("/healthz", bind("healthz", routes.healthz), methods=["GET"]),
        Route("/metrics", bind("metrics", routes.metrics), methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    route_table.append(Route("/debug/timeline", bind("timeline", timeline_page), methods=["GET"]))
    return Starlette(routes=route_table)


async def serve_api(
    resolved: ResolvedConfig,
    served: list[str],
    tokenizer_files: dict[str, Path],
    options: ConnectOptions,
    ready: asyncio.Event | None = None,
) -> None:
    """Run the API until cancelled: the log follower and uvicorn, in one task group."""
    config = resolved.config
    log = await EventLog.connect(config.client_nats_url, log_settings(config), name="shoal-api", options=options)
    ctx = ApiContext.on(log, resolved, served, tokenizer_files)

    def listening() -> None:
        logger.info("API listening on http://{}:{}", config.api_host, config.api_port)
        if ready is not None:
            ready.set()

    server = _Server(
        uvicorn.Config(build_app(ctx), host=config.api_host, port=config.api_port, log_level="warning", lifespan="off"),
        on_listening=listening,
    )
    try:
        async with asyncio.TaskGroup() as group:
            follower = group.create_task(ctx.hub.run())
            await ctx.hub.caught_up.wait()
            await server.serve()
            follower.cancel()
    finally:
        await log.close()


class _Server(uvicorn.Server):
    """uvicorn's server that says when it listens, rather than leaving a `started` flag to poll."""

    def __init__(self, config: uvicorn.Config, *, on_listening: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_listening()
