"""POST /v1/chat/completions: validate, publish `TaskCreated`, turn the task's events into an
OpenAI response (JSON or SSE). A client that goes away cancels its task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from events.catalogue import ChunkGenerated, PrefillProgress, TaskCompleted, TaskCreated, TaskFailed
from events.ids import TaskId, new_task_id
from services.api.context import ApiContext
from services.api.hub import TaskListener
from services.api.openai_format import DONE, ChunkMaker, completion, error_body, sse
from services.api.schemas import ChatCompletionRequest, RequestProblem, decode_chat_request, to_task


async def chat_completions(request: Request, ctx: ApiContext) -> Response:
    body = await _read_body(request, ctx.resolved.config.max_body_bytes)
    chat = decode_chat_request(body)
    task = _check(chat, ctx)
    task_id = task.task_id
    listener = ctx.hub.listen(task_id)
    listener.__enter__()  # before publishing: no event of the task can be missed
    try:
        await ctx.publish(task)
    except BaseException:
        listener.__exit__(None, None, None)
        raise
    headers: dict[str, str] = {"x-shoal-task-id": str(task_id)}
    if chat.stream:
        return StreamingResponse(_stream(ctx, task_id, listener, chat), media_type="text/event-stream", headers=headers)
    return await _complete(request, ctx, task_id, listener, chat, headers)


def _check(chat: ChatCompletionRequest, ctx: ApiContext) -> TaskCreated:
    config = ctx.resolved.config
    known = ctx.known_models()
    if chat.model not in known:
        raise RequestProblem(
            404,
            f"model {chat.model!r} does not exist; known models: {', '.join(known)}",
            param="model",
            code="model_not_found",
        )
    messages, params = to_task(chat, max_tokens_limit=config.max_tokens_limit)
    prompt_tokens = ctx.count_prompt_tokens(chat.model, [m.content for m in messages])
    if prompt_tokens > config.max_prompt_tokens:
        raise RequestProblem(
            413,
            f"prompt has about {prompt_tokens} tokens, over this server's limit of {config.max_prompt_tokens}",
            param="messages",
        )
    if not any(n.status == "up" for n in ctx.hub.state.nodes.values()):
        raise RequestProblem(
            503,
            "no worker node has joined the cluster: start one with `shoal worker` (or use `shoal up`)",
            code="no_workers",
        )
    return TaskCreated(
        env=ctx.stamper.stamp(), task_id=new_task_id(), model=chat.model, messages=messages, params=params
    )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestProblem(413, f"request body of {declared} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestProblem(413, f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _stream(
    ctx: ApiContext, task_id: TaskId, listener: TaskListener, chat: ChatCompletionRequest
) -> AsyncIterator[bytes]:
    maker = ChunkMaker(f"chatcmpl-{task_id}", chat.model)
    ended = False
    try:
        yield maker.role()
        async for event in listener:
            match event:
                case PrefillProgress() if chat.wants_progress and _is_last_rank(ctx, task_id, event.rank):
                    yield maker.progress(
                        event.processed, event.total, _since_created_ms(ctx, task_id, event.env.wall_time)
                    )
                case ChunkGenerated() if event.text:
                    yield maker.content(event.text)
                case TaskCompleted():
                    ended = True
                    yield maker.finish(event.finish_reason)
                    if chat.wants_usage:
                        yield maker.usage(event.usage)
                    yield DONE
                    return
                case TaskFailed():
                    ended = True
                    yield sse(error_body(event.error, kind="task_failed", code="task_failed"))
                    yield DONE
                    return
                case _:
                    pass
    finally:
        listener.__exit__(None, None, None)
        if not ended:
            with anyio.CancelScope(shield=True):  # the client is gone; its cancel must still be published
                await ctx.cancel(task_id, "client_disconnect")


async def _complete(
    request: Request,
    ctx: ApiContext,
    task_id: TaskId,
    listener: TaskListener,
    chat: ChatCompletionRequest,
    headers: dict[str, str],
) -> Response:
    watcher = asyncio.create_task(_wait_disconnect(request))
    collector = asyncio.create_task(_collect(listener))
    try:
        done, _ = await asyncio.wait({watcher, collector}, return_when=asyncio.FIRST_COMPLETED)
        if collector not in done:
            with anyio.CancelScope(shield=True):
                await ctx.cancel(task_id, "client_disconnect")
            return Response(status_code=499)
        text, terminal = collector.result()
    finally:
        watcher.cancel()
        collector.cancel()
        listener.__exit__(None, None, None)
    if isinstance(terminal, TaskFailed):
        return JSONResponse(
            error_body(terminal.error, kind="task_failed", code="task_failed"), status_code=500, headers=headers
        )
    body = completion(f"chatcmpl-{task_id}", chat.model, text, terminal.finish_reason, terminal.usage)
    return JSONResponse(body, headers=headers)


async def _collect(listener: TaskListener) -> tuple[str, TaskCompleted | TaskFailed]:
    parts: list[str] = []
    async for event in listener:
        if isinstance(event, ChunkGenerated):
            parts.append(event.text)
        elif isinstance(event, TaskCompleted | TaskFailed):
            return "".join(parts), event
    raise RuntimeError("task event stream ended without a terminal event")


async def _wait_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.1)


def _is_last_rank(ctx: ApiContext, task_id: TaskId, rank: int) -> bool:
    task = ctx.hub.state.tasks.get(task_id)
    instance = ctx.hub.state.instances.get(task.instance_id) if task and task.instance_id else None
    return instance is not None and rank == instance.world_size - 1


def _since_created_ms(ctx: ApiContext, task_id: TaskId, at: int) -> float:
    task = ctx.hub.state.tasks.get(task_id)
    return (at - task.created_at) / 1e6 if task is not None else 0.0


def problem_response(problem: RequestProblem) -> JSONResponse:
    body = error_body(
        problem.message,
        kind="invalid_request_error" if problem.status < 500 else "server_error",
        param=problem.param,
        code=problem.code,
    )
    return JSONResponse(body, status_code=problem.status)
