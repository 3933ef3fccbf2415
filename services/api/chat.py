"""POST /v1/chat/completions: validate, publish `TaskCreated`, turn the task's events into an
OpenAI response (JSON or SSE). A client that goes away cancels its task.

Both shapes run the task through `run_task`, which owns everything the task needs while it runs:
the listener (entered before publishing), the consumer of its events, and a watch for the
client's `http.disconnect`, in one task group. A streamed response runs it inside the response
itself (`ChatStream`), so nothing outlives the request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from eventlog.publish import LogError
from events.catalogue import ChunkGenerated, LogEvent, PrefillProgress, TaskCompleted, TaskCreated, TaskFailed
from events.ids import KeyId, TaskId, new_task_id
from services.api.auth import caller_of
from services.api.context import ApiContext
from services.api.errors import error_body, error_for, error_response, log_refused
from services.api.hub import TaskEvents
from services.api.openai_format import DONE, ChunkMaker, completion, sse
from services.api.prompts import check_context, prompt_tokens, stop_tokens
from services.api.responses import json_response
from services.api.schemas import ChatCompletionRequest, RequestProblem, decode_chat_request, to_task
from services.api.tool_calls import Split, ToolCallSplitter, split_text

T = TypeVar("T")


async def chat_completions(request: Request, ctx: ApiContext) -> Response:
    body = await _read_body(request, ctx.resolved.config.max_body_bytes)
    chat = decode_chat_request(body)
    task = await _check(chat, ctx, caller_of(request).key_id)
    headers: dict[str, str] = {"x-shoal-task-id": str(task.task_id)}
    if chat.stream:
        return ChatStream(ctx, task, chat, headers)
    outcome = await run_task(ctx, task, request.receive, _collect)
    if outcome is None:
        return Response(status_code=499)
    text, terminal = outcome
    if isinstance(terminal, TaskFailed):
        return error_response(500, terminal.error, kind="task_failed", code="task_failed", headers=headers)
    splitter = _tool_call_splitter(task)
    split = Split(content=text) if splitter is None else split_text(splitter, text)
    completion_id = f"chatcmpl-{task.task_id}"
    body = completion(completion_id, chat.model, split.content, terminal.finish_reason, terminal.usage, split.calls)
    return json_response(body, headers=headers)


async def _check(chat: ChatCompletionRequest, ctx: ApiContext, owner: KeyId) -> TaskCreated:
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
    model = await ctx.prompt_model(chat.model)
    size = await anyio.to_thread.run_sync(prompt_tokens, model, messages)  # long prompts take a while
    check_context(model, size)
    size += stop_tokens(model, params.stop)
    if size > config.max_prompt_tokens:
        raise RequestProblem(
            413,
            f"prompt and stop strings have about {size} tokens, over this server's limit of {config.max_prompt_tokens}",
            param="messages",
        )
    if not any(n.status == "up" for n in ctx.hub.state.nodes.values()):
        raise RequestProblem(
            503,
            "no worker node has joined the cluster: start one with `shoal worker` (or use `shoal up`)",
            code="no_workers",
        )
    return TaskCreated(
        env=ctx.stamper.stamp(), task_id=new_task_id(), model=chat.model, messages=messages, params=params, owner=owner
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


async def run_task(
    ctx: ApiContext, task: TaskCreated, receive: Receive, consume: Callable[[TaskEvents], Awaitable[T]]
) -> T | None:
    """Publish `task` and hand its events to `consume`: what it returns, or None if the client went
    away first. A task not followed to its end is cancelled: nobody is waiting for it any more."""
    outcome: T | None = None
    with ctx.hub.listen(task.task_id) as events:  # before publishing: no event of the task can be missed
        try:
            await ctx.publish(task)
        except LogError as exc:
            raise log_refused(exc) from exc
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_stop_on_disconnect, receive, group.cancel_scope)
                outcome = await consume(events)
                group.cancel_scope.cancel()
        finally:
            if outcome is None:
                with anyio.CancelScope(shield=True):  # the client is gone; its cancel must still be published
                    await ctx.cancel(task.task_id, "client_disconnect")
    return outcome


async def _stop_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Wait for the ASGI server to say the client went away, then stop the request's work."""
    while (await receive())["type"] != "http.disconnect":
        pass  # request body after its end is no one's to read
    scope.cancel()


class ChatStream(Response):
    """The SSE response of a streamed chat: it publishes and follows the task while it streams."""

    media_type = "text/event-stream"

    def __init__(
        self, ctx: ApiContext, task: TaskCreated, chat: ChatCompletionRequest, headers: dict[str, str]
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._ctx = ctx
        self._task = task
        self._chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stream(events: TaskEvents) -> TaskCompleted | TaskFailed:
            return await self._stream(events, send)

        try:
            await run_task(self._ctx, self._task, receive, stream)
        except RequestProblem as problem:  # raised before the stream starts: the task was not taken
            await error_for(problem)(scope, receive, send)

    async def _stream(self, events: TaskEvents, send: Send) -> TaskCompleted | TaskFailed:
        """Send the task's events as chunks until its terminal event, which ends the response."""
        task_id = self._task.task_id
        maker = ChunkMaker(f"chatcmpl-{task_id}", self._chat.model)
        splitter = _tool_call_splitter(self._task)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": maker.role(), "more_body": True})
        while True:
            event = await events.next()
            for chunk in _sse_chunks(self._ctx, self._chat, task_id, maker, splitter, event):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if isinstance(event, TaskCompleted | TaskFailed):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return event


def _sse_chunks(
    ctx: ApiContext,
    chat: ChatCompletionRequest,
    task_id: TaskId,
    maker: ChunkMaker,
    splitter: ToolCallSplitter | None,
    event: LogEvent,
) -> list[bytes]:
    match event:
        case PrefillProgress() if chat.wants_progress and _is_last_rank(ctx, task_id, event.rank):
            return [maker.progress(event.processed, event.total, _since_created_ms(ctx, task_id, event.env.wall_time))]
        case ChunkGenerated() if event.text and splitter is None:
            return [maker.content(event.text)]
        case ChunkGenerated() if event.text and splitter is not None:
            return _split_chunks(maker, splitter, splitter.feed(event.text))
        case TaskCompleted():
            usage = [maker.usage(event.usage)] if chat.wants_usage else []
            held = [] if splitter is None else _split_chunks(maker, splitter, splitter.finish())
            called = splitter is not None and splitter.calls_made > 0
            return [*held, maker.finish(event.finish_reason, called), *usage, DONE]
        case TaskFailed():
            return [sse(msgspec.to_builtins(error_body(event.error, kind="task_failed", code="task_failed"))), DONE]
        case _:
            return []


def _tool_call_splitter(task: TaskCreated) -> ToolCallSplitter | None:
    """Only a task that offered the model tools has tool calls to look for in its text."""
    if not task.params.tools:
        return None
    return ToolCallSplitter(call_id=lambda n: f"call_{task.task_id}_{n}")


def _split_chunks(maker: ChunkMaker, splitter: ToolCallSplitter, split: Split) -> list[bytes]:
    first = splitter.calls_made - len(split.calls)
    content = [maker.content(split.content)] if split.content else []
    return [*content, *(maker.tool_call(first + i, call) for i, call in enumerate(split.calls))]


async def _collect(events: TaskEvents) -> tuple[str, TaskCompleted | TaskFailed]:
    parts: list[str] = []
    while True:
        event = await events.next()
        if isinstance(event, ChunkGenerated):
            parts.append(event.text)
        elif isinstance(event, TaskCompleted | TaskFailed):
            return "".join(parts), event


def _is_last_rank(ctx: ApiContext, task_id: TaskId, rank: int) -> bool:
    task = ctx.hub.state.tasks.get(task_id)
    instance = ctx.hub.state.instances.get(task.instance_id) if task and task.instance_id else None
    return instance is not None and rank == instance.world_size - 1


def _since_created_ms(ctx: ApiContext, task_id: TaskId, at: int) -> float:
    task = ctx.hub.state.tasks.get(task_id)
    return (at - task.created_at) / 1e6 if task is not None else 0.0
