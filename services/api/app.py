"""The Starlette app and the API service that serves it next to its log follower."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import uvicorn
from loguru import logger
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from eventlog.publish import LogError
from services.api import chat, completions, messages, responses_api, routes
from services.api.access_log import ROUTE_KEY, AccessLog
from services.api.anthropic_errors import anthropic_error_for, with_anthropic_errors
from services.api.auth import ApiAccess, Caller, Need, Refusal, admit, presented_key
from services.api.browser import BrowserGuard, BrowserRules
from services.api.connections import connection_budget, guarded_protocol
from services.api.context import ApiContext
from services.api.dashboard_routes import dashboard_events, load_static, static_response
from services.api.errors import EXCEPTION_HANDLERS, error_for
from services.api.openapi import openapi_document
from services.api.schemas import RequestProblem
from services.api.timeline import timeline_page
from services.config import ConfigError, ResolvedConfig, ShoalConfig, log_settings
from services.supervise import supervise

# How long a stopping API waits for its requests in flight to cancel their tasks and tell their
# clients, before it closes their connections and its log: each needs one publish.
DRAIN_SECONDS = 3.0

Handler = Callable[[Request, ApiContext], Awaitable[Response]]
ErrorFormat = Callable[[Exception], Response]  # a route's errors in its API's shape


def build_app(ctx: ApiContext) -> Starlette:
    def bind(
        name: str, handler: Handler, need: Need, errors: ErrorFormat = error_for
    ) -> Callable[[Request], Awaitable[Response]]:
        """The route `name`: its caller checked against `need`, its problems as JSON errors in
        `errors`' shape, counted."""

        async def endpoint(request: Request) -> Response:
            request.scope[ROUTE_KEY] = name  # the access log's name for it
            checked = ctx.access.check(presented_key(request.headers), need)
            if isinstance(checked, Refusal):
                response = checked.response() if errors is error_for else errors(checked.problem())
            else:
                response = await _answer(handler, request, ctx, checked, errors)
            ctx.metrics.requests[(name, response.status_code)] += 1
            return response

        return endpoint

    document = openapi_document()
    static = load_static()

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    async def dashboard_file(request: Request) -> Response:
        return static_response(static, request.path_params.get("name", "dashboard.html"))

    # Who may call what: a task's routes any key (ownership is checked in the route); the config and
    # the debug pages an admin key (they show every task and setting); /metrics any key (aggregates
    # only, but not for anyone on the network, and a scraper needs no admin power); /healthz, /livez,
    # /readyz and the OpenAPI document nobody (load balancers and client generators have no key). The dashboard's
    # files nobody (they hold no data); its data an admin key: it shows every key's tasks, hosts
    # and diagnoses, and links to the admin-only timeline.
    route_table = [
        Route("/v1/chat/completions", bind("chat", chat.chat_completions, "key"), methods=["POST"]),
        Route("/v1/completions", bind("completions", completions.completions, "key"), methods=["POST"]),
        Route("/v1/messages", bind("messages", messages.create_message, "key", anthropic_error_for), methods=["POST"]),
        Route(
            "/v1/messages/count_tokens",
            bind("count_tokens", messages.count_tokens, "key", anthropic_error_for),
            methods=["POST"],
        ),
        Route("/v1/responses", bind("responses", responses_api.create_response, "key"), methods=["POST"]),
        Route("/v1/models", bind("models", routes.list_models, "key"), methods=["GET"]),
        Route("/v1/models/{model:path}", bind("model", routes.get_model, "key"), methods=["GET"]),
        Route("/v1/tasks/{task_id}", bind("task", routes.get_task, "key"), methods=["GET"]),
        Route("/v1/tasks/{task_id}/cancel", bind("cancel", routes.cancel_task, "key"), methods=["POST"]),
        Route("/v1/config", bind("config", routes.get_config, "admin"), methods=["GET"]),
        Route("/v1/admin/models/load", bind("load_model", routes.load_model, "admin"), methods=["POST"]),
        Route("/v1/admin/models/unload", bind("unload_model", routes.unload_model, "admin"), methods=["POST"]),
        Route("/healthz", bind("healthz", routes.healthz, "nothing"), methods=["GET"]),
        Route("/livez", bind("livez", routes.livez, "nothing"), methods=["GET"]),
        Route("/readyz", bind("readyz", routes.readyz, "nothing"), methods=["GET"]),
        Route("/metrics", bind("metrics", routes.metrics, "key"), methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/", dashboard_file, methods=["GET"]),
        Route("/static/{name}", dashboard_file, methods=["GET"]),
        Route("/v1/dashboard/events", bind("dashboard", dashboard_events, "admin"), methods=["GET"]),
    ]
    route_table.append(Route("/debug/timeline", bind("timeline", timeline_page, "admin"), methods=["GET"]))
    return Starlette(
        routes=route_table,
        middleware=_middleware(ctx.resolved.config),
        exception_handlers=with_anthropic_errors(EXCEPTION_HANDLERS),
    )


async def _answer(
    handler: Handler, request: Request, ctx: ApiContext, caller: Caller, errors: ErrorFormat = error_for
) -> Response:
    admit(request, caller)
    try:
        return await handler(request, ctx)
    except (RequestProblem, LogError) as exc:
        return errors(exc)
    except Exception as exc:  # a bug: answered here, so it is counted and the connection stays open
        logger.exception("{} {} failed", request.method, request.url.path)
        return errors(exc)


def _middleware(config: ShoalConfig) -> list[Middleware]:
    """The access log around everything (a refusal gets its line too), then the browser rules (a
    refused Host or origin gets nothing further), then CORS if configured."""
    layers = [Middleware(AccessLog), Middleware(BrowserGuard, rules=BrowserRules(config.api_host, config.cors_origins))]
    if config.cors_origins:
        cors = Middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-api-key", "anthropic-version", "anthropic-beta"],
            expose_headers=["x-shoal-task-id"],
            max_age=600,
        )
        layers.append(cors)
    return layers


async def serve_api(
    resolved: ResolvedConfig,
    access: ApiAccess,
    served: list[str],
    nats: NatsEndpoint,
    ready: asyncio.Event | None = None,
) -> None:
    """Run the API until cancelled: the log follower and uvicorn, in one task group."""
    with listen_socket(resolved) as listener:  # first: a port in use is a setting to fix, not a restart
        await _serve_on(listener, resolved, access, served, nats, ready)


async def _serve_on(
    listener: socket.socket,
    resolved: ResolvedConfig,
    access: ApiAccess,
    served: list[str],
    nats: NatsEndpoint,
    ready: asyncio.Event | None,
) -> None:
    config = resolved.config
    log = await EventLog.connect(nats, log_settings(config), name="shoal-api")
    ctx = ApiContext.on(log, resolved, served, access=access)

    def listening() -> None:
        logger.info("API listening on http://{}:{} ({})", config.api_host, config.api_port, access.describe())
        if ready is not None:
            ready.set()

    # httptools (the guarded protocol's base), not h11: parsing in C halves the loop's time per
    # request, which keeps /healthz under 100 ms (p99) through a burst of 500 requests
    # (tests/e2e/test_burst.py; h11: ~110-190 ms). A slow or silent client holds at most its own
    # connection, and never the last descriptor (`services/api/connections.py`).
    uvicorn_config = uvicorn.Config(
        build_app(ctx),
        host=config.api_host,
        port=config.api_port,
        http=guarded_protocol(connection_budget()),
        log_config=None,  # its loggers go through loguru's sink (`services.log_routing`), not handlers of its own
        access_log=False,  # one line per request is `AccessLog`'s, with the key id and task
        log_level="warning",
        lifespan="off",
    )
    server = _Server(uvicorn_config, on_listening=listening)
    try:
        async with asyncio.TaskGroup() as group:
            # The follow is supervised on its own: while it restarts, uvicorn keeps answering
            # (/healthz says "degraded") instead of the whole API going down with it.
            follow = supervise("API log follow", ctx.hub.run, health=ctx.hub.follow_health)
            follower = group.create_task(follow)
            preloader = group.create_task(supervise("API tokenizer preload", ctx.preload_prompt_models))
            await ctx.hub.caught_up.wait()
            await server.serve(sockets=[listener])
            follower.cancel()
            preloader.cancel()
    finally:
        try:
            await stop_requests(ctx, server)
        finally:
            server.stop_listening()
            await log.close()


async def stop_requests(ctx: ApiContext, server: _Server, drain_seconds: float = DRAIN_SECONDS) -> None:
    """The API's first step out: take no new connection, tell each request in flight that the API
    is stopping (`ApiContext.stopping`: it cancels its task and ends its client's stream or answer
    with a 503's message), and give them `drain_seconds` at most to do it while the log is still open."""
    server.stop_accepting()
    ctx.stopping.set()
    clock = asyncio.get_running_loop().time
    deadline = clock() + drain_seconds
    while ctx.hub.listening and clock() < deadline:
        await asyncio.sleep(0.02)


def listen_socket(resolved: ResolvedConfig) -> socket.socket:
    """The API's listening socket, bound here rather than by uvicorn, whose bind failure logs and
    calls `sys.exit` inside the event loop (a `shoal up` then hung on its way out): an address in
    use or not this host's is a `ConfigError` naming the setting, which ends the API (and `shoal up`)
    with that message instead of being retried."""
    config = resolved.config
    host, port = config.api_host, config.api_port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)  # TCP_NODELAY: set per connection (connections.py)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses it at once
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        source = resolved.sources.get("api_port", "default")
        raise ConfigError(
            "api_port",
            port,
            source,
            f"a port this host can listen on at {host} ({exc.strerror or exc}: another shoal up or API may hold it; "
            "stop it, or choose another port: --port / api_port / SHOAL_API_PORT)",
        ) from None
    listener.set_inheritable(True)
    return listener


class _Server(uvicorn.Server):
    """uvicorn's server that says when it listens, rather than leaving a `started` flag to poll."""

    def __init__(self, config: uvicorn.Config, *, on_listening: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_listening()

    def stop_listening(self) -> None:
        """Stop the loop watching the listening socket and close it, and close the connections.
        uvicorn does this only on a clean shutdown: a cancelled `serve` (a crash under `supervise`,
        a stopped test) left the socket's key in the loop's selector after `listen_socket` closed
        it, and a socket the loop opened later with the same number (the restarted API's NATS
        connection, say) was never read: asyncio only updated the stale key."""
        self.stop_accepting()
        for connection in list(self.server_state.connections):
            connection.shutdown()

    def stop_accepting(self) -> None:
        """Close the listening sockets; the connections open stay."""
        for listening in getattr(self, "servers", []):  # set by `startup`, which a cancel may precede
            listening.close()
