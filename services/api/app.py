"""The Starlette app and the API service that serves it next to its log follower."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvicorn
from loguru import logger
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from eventlog.log import EventLog
from events.catalogue import Origin
from events.stamp import Stamper
from services.api import chat, routes
from services.api.context import ApiContext
from services.api.hub import LogHub
from services.api.metrics import Metrics
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
    resolved: ResolvedConfig, served: list[str], tokenizer_files: dict[str, Path], ready: asyncio.Event | None = None
) -> None:
    """Run the API until cancelled: the log follower and uvicorn, in one task group."""
    config = resolved.config
    log = await EventLog.connect(config.client_nats_url, log_settings(config), name="shoal-api")
    metrics = Metrics()
    hub = LogHub(log, metrics)
    ctx = ApiContext(
        log=log,
        hub=hub,
        stamper=Stamper(Origin(service="api")),
        resolved=resolved,
        metrics=metrics,
        served=served,
        tokenizer_files=tokenizer_files,
    )
    server = uvicorn.Server(
        uvicorn.Config(build_app(ctx), host=config.api_host, port=config.api_port, log_level="warning", lifespan="off")
    )
    try:
        async with asyncio.TaskGroup() as group:
            follower = group.create_task(hub.run())
            await hub.caught_up.wait()
            serving = group.create_task(server.serve())
            while not server.started:
                if serving.done() or follower.done():
                    break
                await asyncio.sleep(0.02)
            if server.started:
                logger.info("API listening on http://{}:{}", config.api_host, config.api_port)
                if ready is not None:
                    ready.set()
            await serving
            follower.cancel()
    finally:
        await log.close()
