"""The API's routes other than chat completions: models, tasks, cancel, config, health, metrics."""

from __future__ import annotations

from typing import Annotated, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from events.catalogue import ModelLoadRequested, ModelUnloadRequested, PlacementHints
from events.ids import InvalidId, NodeId, TaskId, check_token
from events.state import TaskInfo
from services.api.auth import caller_of
from services.api.context import ApiContext
from services.api.metrics import exposition
from services.api.model_cards import model_card
from services.api.responses import (
    CancelAccepted,
    Health,
    Liveness,
    ModelAction,
    ModelCard,
    ModelList,
    Readiness,
    json_response,
)
from services.api.schemas import RequestProblem
from services.api.task_stream import check_model
from services.models import existing_model_dir, is_hub_model, model_error
from services.ops.task_history import task_from_log


async def list_models(request: Request, ctx: ApiContext) -> Response:
    data = [await _card(ctx, model) for model in ctx.known_models()]
    return json_response(ModelList(object="list", data=data))


async def get_model(request: Request, ctx: ApiContext) -> Response:
    """`GET /v1/models/{model}` (the openai client's `models.retrieve`): one card; a Hub id's
    slash is part of the path."""
    model: str = request.path_params["model"]
    check_model(ctx, model)
    return json_response(await _card(ctx, model))


async def _card(ctx: ApiContext, model: str) -> ModelCard:
    prompt_model = await ctx.prompt_model(model)  # the context length, as prompts are checked against
    context_length = prompt_model.context_length if prompt_model is not None else None
    return model_card(ctx.hub.state, model, context_length)


async def _callers_task(request: Request, ctx: ApiContext) -> TaskInfo:
    """The task named in the path, if the caller may see it: another key's task is answered exactly
    as a task that does not exist, so a 404 tells nothing about other keys' tasks. A task no longer
    held whole in the State (an older ended one, `events.retention`) is read back from the log."""
    task_id = _task_id(request)
    task = ctx.hub.state.tasks.get(task_id) or await task_from_log(ctx.log, task_id, ctx.hub.state)
    if task is None or not caller_of(request).may_see(task.owner):
        raise RequestProblem(404, f"task {task_id!r} does not exist", code="task_not_found")
    return task


async def get_task(request: Request, ctx: ApiContext) -> Response:
    return json_response(await _callers_task(request, ctx))


async def cancel_task(request: Request, ctx: ApiContext) -> Response:
    task = await _callers_task(request, ctx)
    task_id = task.task_id
    if task.ended:
        raise RequestProblem(409, f"task {task_id!r} already ended ({task.status})", code="task_ended")
    await ctx.cancel(task_id, "api")
    return json_response(CancelAccepted(task_id=task_id, status="cancelling"), status=202)


# The ids a client sees on its completion (`chatcmpl-<task id>`, `cmpl-<task id>`, `msg_<task id>`) name the task too.
COMPLETION_ID_PREFIXES = ("chatcmpl-", "cmpl-", "msg_")


def _task_id(request: Request) -> TaskId:
    """The path's task id (or the completion id that carries it), refused unless it is one (a
    subject token): never looked up or published."""
    named: str = request.path_params["task_id"]
    for prefix in COMPLETION_ID_PREFIXES:
        named = named.removeprefix(prefix)
    try:
        return TaskId(check_token("task id", named))
    except InvalidId as exc:
        raise RequestProblem(400, str(exc), param="task_id", code="invalid_task_id") from exc


async def get_config(request: Request, ctx: ApiContext) -> Response:
    return Response(msgspec.json.encode(ctx.resolved.to_dict()), media_type="application/json")


def _health(ctx: ApiContext) -> Health:
    state = ctx.hub.state
    nodes_up = sum(1 for n in state.nodes.values() if n.status == "up")
    ready = sum(1 for i in state.instances.values() if i.ready)
    errors = {model: error for model in ctx.known_models() if (error := model_error(state, model))}
    degraded = ctx.hub.degraded
    serving = "ok" if ready else "model_unavailable" if errors else "starting" if nodes_up else "no_workers"
    return Health(
        status="degraded" if degraded else serving,
        last_seq=state.last_seq,
        nodes_up=nodes_up,
        ready_instances=ready,
        log_caught_up=ctx.hub.caught_up.is_set(),
        errors=errors,
        degraded=degraded,
    )


async def healthz(request: Request, ctx: ApiContext) -> Response:
    body = _health(ctx)
    return json_response(body, status=503 if body.degraded else 200)


async def livez(request: Request, ctx: ApiContext) -> Response:
    """The process answers: its event loop runs this. Nothing else is checked, so a load balancer or
    an orchestrator restarts the API only when it is stuck, never while the cluster is starting."""
    return json_response(Liveness(status="ok"))


async def readyz(request: Request, ctx: ApiContext) -> Response:
    """A model can be served now (an instance is ready and the API follows the log): 200, else 503
    with the reason, so a load balancer sends requests only to an API that can answer them."""
    health = _health(ctx)
    reason = not_ready_reason(health)
    return json_response(
        Readiness(ready=not reason, status=health.status, reason=reason), status=503 if reason else 200
    )


def not_ready_reason(health: Health) -> str:
    """Why no model can be served now ("" when one can)."""
    match health.status:
        case "ok":
            return ""
        case "degraded":
            return f"the API cannot follow the event log: {health.degraded}"
        case "no_workers":
            return "no worker node is up: start one with `shoal worker` (or use `shoal up`)"
        case "starting":
            return f"no instance is ready yet ({health.nodes_up} nodes up): the model is being placed or loaded"
        case "model_unavailable":
            return "no model can be served: " + "; ".join(f"{model}: {error}" for model, error in health.errors.items())


async def metrics(request: Request, ctx: ApiContext) -> Response:
    body, content_type = exposition(ctx.registry, request.headers.get("accept"))
    return Response(body, headers={"content-type": content_type})


class LoadModel(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/admin/models/load`: place `model` now (an admin key)."""

    model: str
    pin: bool = False  # never unloaded for idleness nor evicted
    nodes: list[str] = msgspec.field(default_factory=list)  # only these nodes
    min_nodes: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    max_nodes: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0  # 0 = as many as it needs


class UnloadModel(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/admin/models/unload`: retire `model`'s instances once they finish their tasks."""

    model: str


_Body = TypeVar("_Body", LoadModel, UnloadModel)


async def load_model(request: Request, ctx: ApiContext) -> Response:
    body = _admin_body(await request.body(), LoadModel)
    if body.max_nodes and body.max_nodes < body.min_nodes:
        raise RequestProblem(400, "max_nodes is below min_nodes", param="max_nodes", code="invalid_value")
    try:
        nodes = [NodeId(check_token("node id", node)) for node in body.nodes]
    except InvalidId as exc:
        raise RequestProblem(400, str(exc), param="nodes", code="invalid_value") from exc
    _check_servable(ctx, body.model)
    hints = PlacementHints(nodes=nodes, min_nodes=body.min_nodes, max_nodes=body.max_nodes)
    event = ModelLoadRequested(env=ctx.stamper.stamp(), model=body.model, pinned=body.pin, hints=hints)
    seq = await ctx.publish(event)
    return json_response(ModelAction(model=body.model, action="load", seq=seq), status=202)


async def unload_model(request: Request, ctx: ApiContext) -> Response:
    body = _admin_body(await request.body(), UnloadModel)
    check_model(ctx, body.model)
    seq = await ctx.publish(ModelUnloadRequested(env=ctx.stamper.stamp(), model=body.model))
    return json_response(ModelAction(model=body.model, action="unload", seq=seq), status=202)


def _admin_body(raw: bytes, kind: type[_Body]) -> _Body:
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise RequestProblem(400, f"invalid request body: {exc}", code="invalid_request_body") from exc


def _check_servable(ctx: ApiContext, model: str) -> None:
    """A model an operator may load: one this API serves already, a Hub id (owner/name), or a
    model directory on this machine (the nodes read it at the same path)."""
    if model in ctx.known_models() or is_hub_model(model) or existing_model_dir(model) is not None:
        return
    raise RequestProblem(
        404,
        f"model {model!r} is neither served, a Hub id (owner/name) nor a model directory on the API's machine",
        param="model",
        code="model_not_found",
    )
