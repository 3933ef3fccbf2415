"""What every task route shares: admitting a task, running it for one request, streaming it.

A route reads its body (`read_body`), builds a `TaskCreated` that passed `admit`, and runs it
through `run_task`, which owns everything the task needs while it runs: the listener (entered
before publishing), the consumer of its events, and a watch for the client's `http.disconnect`,
in one task group. A streamed response runs it inside the response itself (`TaskStream`), so
nothing outlives the request. A client that goes away cancels its task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import anyio
import msgspec
from loguru import logger
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from eventlog.publish import LogError
from events.catalogue import (
    ChatMessage,
    ChunkGenerated,
    LogEvent,
    RawPrompt,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskParams,
)
from events.constraints import ToolCallRequired
from events.ids import KeyId, new_task_id
from events.logprobs import TokenLogprob
from events.vocabulary import CancelReason, FinishReason
from services.api.connections import BODY_DEADLINE_SECONDS
from services.api.context import ApiContext
from services.api.errors import (
    error_response,
    failure_status,
    log_refused,
)
from services.api.hub import TaskEvents
from services.api.prompts import (
    check_logit_bias,
    check_prompt_size,
    check_thinking_switch,
    stop_tokens,
    with_forced_format,
)
from services.api.responses import json_response
from services.api.schemas import RequestProblem
from services.api.stream_errors import OpenAIStreamErrors, StreamErrors, internal_problem

T = TypeVar("T")
STOPPING_RETRY_AFTER_SECONDS = 5  # a 503's Retry-After while the API stops: a restart takes seconds
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: clients skip it, proxies see a live connection


def check_model(ctx: ApiContext, model_name: str) -> None:
    known = ctx.known_models()
    if model_name not in known:
        raise RequestProblem(
            404,
            f"model {model_name!r} does not exist; known models: {', '.join(known)}",
            param="model",
            code="model_not_found",
        )


async def admit(
    ctx: ApiContext,
    model_name: str,
    params: TaskParams,
    owner: KeyId,
    *,
    messages: list[ChatMessage],
    raw_prompt: RawPrompt | None = None,
) -> TaskCreated:
    """The task of a request that passed every check a runner would otherwise fail it on (the
    model's name is checked first, by `check_model`, before the request's values)."""
    config = ctx.resolved.config
    if params.n > config.max_choices:
        raise RequestProblem(
            400,
            f"n={params.n} is over this server's limit of {config.max_choices} completions per request "
            "(max_choices: each is a row of the model's batch)",
            param="n",
        )
    if params.logit_bias:  # a request that can never run is told so, not to retry (no tokenizing: cheap)
        check_logit_bias(await ctx.prompt_model(model_name), params.logit_bias)
    full = ctx.hub.queues.refusal(
        model_name, config.max_queued_tasks, owner, config.max_queued_tasks_per_key, rows=params.n
    )
    if full is not None:  # before the prompt is tokenized: a refusal in a burst must cost little
        raise full
    param = "messages" if raw_prompt is None else "prompt"
    model = await ctx.prompt_model(model_name)
    # sized on a thread of a lane (long prompts: a lane of their own), in the owner's turn
    size = await ctx.prompt_lanes.size(owner, model, messages, params.tools, raw_prompt, params.enable_thinking)
    if params.enable_thinking is not None:
        check_thinking_switch(model)
    check_prompt_size(model, size, param)
    if isinstance(params.constraint, ToolCallRequired):
        params = msgspec.structs.replace(params, constraint=with_forced_format(model, params.constraint))
    size += stop_tokens(model, params.stop)
    if size > config.max_prompt_tokens:
        raise RequestProblem(
            413,
            f"prompt and stop strings have about {size} tokens, over this server's limit of {config.max_prompt_tokens}",
            param=param,
        )
    if not any(n.status == "up" for n in ctx.hub.state.nodes.values()):
        raise RequestProblem(
            503,
            "no worker node has joined the cluster: start one with `shoal worker` (or use `shoal up`)",
            code="no_workers",
        )
    return TaskCreated(
        env=ctx.stamper.stamp(),
        task_id=new_task_id(),
        model=model_name,
        messages=messages,
        params=params,
        owner=owner,
        prompt=raw_prompt,
    )


async def read_body(request: Request, limit: int, deadline_seconds: float = BODY_DEADLINE_SECONDS) -> bytes:
    """The body, at most `limit` bytes, all of it within `deadline_seconds` (a body sent a byte at
    a time would hold its connection for ever: 408)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestProblem(413, f"request body of {declared} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(deadline_seconds):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestProblem(413, f"request body is over the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestProblem(
            408, f"request body not received within {deadline_seconds:g}s ({size} bytes came)", code="request_timeout"
        ) from None
    return b"".join(chunks)


async def run_task(
    ctx: ApiContext, task: TaskCreated, receive: Receive, consume: Callable[[TaskEvents], Awaitable[T]]
) -> T | None:
    """Publish `task` and hand its events to `consume`: what it returns, or None if the client went
    away first. A task not followed to its end is cancelled: nobody is waiting for it any more."""
    if ctx.stopping.is_set():
        raise server_stopping()
    outcome: T | None = None
    reason: CancelReason = "client_disconnect"
    with ctx.hub.listen(task.task_id) as events:  # before publishing: no event of the task can be missed
        config = ctx.resolved.config
        ctx.hub.queues.admit(task, config.max_queued_tasks, config.max_queued_tasks_per_key)  # counted, or a 429
        try:
            await ctx.publish(task)
        except LogError as exc:
            ctx.hub.queues.withdraw(task.task_id)
            raise log_refused(exc) from exc
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_stop_on_disconnect, receive, group.cancel_scope)
                group.start_soon(_stop_on_shutdown, ctx.stopping, group.cancel_scope)
                outcome = await consume(events)
                group.cancel_scope.cancel()
            if outcome is None and ctx.stopping.is_set():
                reason = "shutdown"
        except Exception as exc:
            reason = "server_error"  # a bug while following it: nobody will read the rest
            sole = _sole(exc)  # not the task group's wrapping: the route's answer names the bug
            if sole is exc:
                raise
            raise sole from exc
        finally:
            if outcome is None:
                with anyio.CancelScope(shield=True):  # the client is gone; its cancel must still be published
                    await _publish_cancel(ctx, task, reason)
    if outcome is None and reason == "shutdown":
        raise server_stopping()
    return outcome


async def _publish_cancel(ctx: ApiContext, task: TaskCreated, reason: CancelReason) -> None:
    """The task's cancel; while the API stops, one that cannot be published any more (the log
    closed under a drain that ran out) is logged, not raised: the client is told why either way."""
    try:
        await ctx.cancel(task.task_id, reason)
    except Exception as exc:
        if reason != "shutdown":
            raise
        logger.warning("api stopping: cannot publish the cancel of task {}: {}", task.task_id, exc)


def server_stopping() -> RequestProblem:
    """What a request gets when the API stops before its task ends (a 503 before its stream started,
    its stream's last event after)."""
    return RequestProblem(
        503,
        "the server is shutting down: this request was stopped before it finished (its task is cancelled); "
        "send it again when the server is back",
        code="server_shutting_down",
        headers={"Retry-After": str(STOPPING_RETRY_AFTER_SECONDS)},
    )


def _sole(exc: Exception) -> Exception:
    """The one exception inside (nested) exception groups of one, else `exc` itself."""
    found: BaseException = exc
    while isinstance(found, BaseExceptionGroup):
        inner: tuple[BaseException, ...] = found.exceptions  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if len(inner) != 1:
            break
        found = inner[0]
    return found if isinstance(found, Exception) else exc


async def _stop_on_shutdown(stopping: asyncio.Event, scope: anyio.CancelScope) -> None:
    """Wait for the API to begin stopping (`ApiContext.stopping`), then stop the request's work."""
    await stopping.wait()
    scope.cancel()


async def _stop_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Wait for the ASGI server to say the client went away, then stop the request's work."""
    while (await receive())["type"] != "http.disconnect":
        pass  # request body after its end is no one's to read
    scope.cancel()


async def respond(
    ctx: ApiContext,
    task: TaskCreated,
    request: Request,
    *,
    shape: StreamShape | None,
    answer: Callable[[Collected, TaskCompleted], msgspec.Struct],
) -> Response:
    """Run `task` for `request`: streamed in `shape` when there is one, else answered as JSON."""
    headers = {"x-shoal-task-id": str(task.task_id)}
    if shape is not None:
        return TaskStream(ctx, task, shape, headers, keepalive_seconds(ctx))
    return await run_to_end(ctx, task, request, headers, answer)


async def run_to_end(
    ctx: ApiContext,
    task: TaskCreated,
    request: Request,
    headers: dict[str, str],
    answer: Callable[[Collected, TaskCompleted], msgspec.Struct],
) -> Response:
    """The JSON response of a task not streamed: `answer`'s body once it completed, a 504 if it
    ran past its deadline, a 400 if the runners refused the request itself (`TaskFailed.invalid_request`:
    its size against the KV, a grammar), a 500 if it failed otherwise, 499 (nobody reads it) if the client went away."""
    outcome = await run_task(ctx, task, request.receive, collect)
    if outcome is None:
        return Response(status_code=499)
    terminal = outcome.terminal
    if isinstance(terminal, TaskFailed):
        status, kind, code = failure_status(terminal)
        return error_response(status, terminal.error, kind=kind, code=code, headers=headers)
    return json_response(answer(outcome, terminal), headers=headers)


@dataclass(frozen=True, slots=True)
class ChoiceText:
    """One completion of a task: its text and its tokens' logprobs (None unless asked)."""

    text: str
    logprobs: list[TokenLogprob] | None


@dataclass(frozen=True, slots=True)
class Collected:
    """A task followed to its end: its text, its tokens' logprobs (None unless asked), how it ended;
    a task of several completions (`TaskParams.n`): those are choice 0's, `others` the rest's."""

    text: str
    logprobs: list[TokenLogprob] | None
    terminal: TaskCompleted | TaskFailed
    others: tuple[ChoiceText, ...] = ()

    @property
    def choices(self) -> list[ChoiceText]:
        """Every completion, by index."""
        return [ChoiceText(self.text, self.logprobs), *self.others]


def finish_reasons(terminal: TaskCompleted) -> list[FinishReason]:
    """How each completion of a task ended, by index."""
    return [c.finish_reason for c in terminal.choices] or [terminal.finish_reason]


async def collect(events: TaskEvents) -> Collected:
    parts: dict[int, list[str]] = {}  # by choice
    logprobs: dict[int, list[TokenLogprob]] = {}
    while True:
        event = await events.next()
        if isinstance(event, ChunkGenerated):
            parts.setdefault(event.choice, []).append(event.text)
            if event.logprobs is not None:
                logprobs.setdefault(event.choice, []).extend(event.logprobs)
        elif isinstance(event, TaskCompleted | TaskFailed):
            # at least one: a task ended before any token (or by the master, which lists no choices)
            count = max([1, len(event.choices) if isinstance(event, TaskCompleted) else 1, *(c + 1 for c in parts)])
            texts = [ChoiceText("".join(parts.get(c, [])), logprobs.get(c)) for c in range(count)]
            return Collected(texts[0].text, texts[0].logprobs, event, tuple(texts[1:]))


class StreamShape(Protocol):
    """How one route writes a task's events as server-sent events."""

    def opening(self) -> list[bytes]: ...
    def chunks(self, event: LogEvent) -> list[bytes]: ...


class TaskStream(Response):
    """An SSE response that publishes and follows its task while it streams.

    Whenever the client has been sent nothing for `keepalive_seconds` (None: never), it is sent an
    SSE comment: while the task waits in the queue, through a long prefill, through a decode held
    up by a fault until the master's stall deadline. So neither a proxy nor a NAT takes a waiting
    stream for a dead connection, and a client can: one that hears nothing for a few intervals
    has lost its connection (the chaos bench's clients give up on one after `SILENCE_INTERVALS`)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        ctx: ApiContext,
        task: TaskCreated,
        shape: StreamShape,
        headers: dict[str, str],
        keepalive_seconds: float | None,
        errors: StreamErrors | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._ctx = ctx
        self._task = task
        self._shape = shape
        self._errors = errors or OpenAIStreamErrors()
        self._keepalive = keepalive_seconds
        self._last_sent = 0.0  # anyio's clock when the client was last sent a byte
        self._started = False  # the response's start was sent: an error can no longer be a status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stream(events: TaskEvents) -> TaskCompleted | TaskFailed:
            return await self._stream(events, send)

        try:
            await run_task(self._ctx, self._task, receive, stream)
        except RequestProblem as problem:
            if not self._started:  # the task was not taken (or the API stopped before its first event)
                await self._errors.response(problem)(scope, receive, send)
                return
            await self._send(send, self._errors.last_event(problem))  # the API stopped mid-stream
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception as exc:
            if not self._started:
                raise  # answered as a 500 by the server's outermost layer
            # A bug after the stream started (its task is cancelled): the client gets it as the
            # stream's last event and [DONE] rather than a connection cut mid-body.
            logger.exception("streaming task {} failed", self._task.task_id)
            await self._send(send, self._errors.last_event(internal_problem(exc)))
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, events: TaskEvents, send: Send) -> TaskCompleted | TaskFailed:
        """Send the task's events as chunks until its terminal event, which ends the response."""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self._started = True
        self._last_sent = anyio.current_time()
        for chunk in self._shape.opening():
            await self._send(send, chunk)
        while True:
            event = await self._next_event(events, send)
            for chunk in self._shape.chunks(event):
                await self._send(send, chunk)
            if isinstance(event, TaskCompleted | TaskFailed):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return event

    async def _send(self, send: Send, chunk: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        self._last_sent = anyio.current_time()

    async def _next_event(self, events: TaskEvents, send: Send) -> LogEvent:
        """The task's next event, sending a keepalive comment whenever the client has been sent
        nothing for the interval (events it is not shown, such as prefill progress, count as
        nothing). An event already waiting is taken without a timer: tokens come in bursts."""
        queued = events.next_nowait()
        if queued is not None:
            return queued
        while self._keepalive is not None:
            with anyio.move_on_after(self._last_sent + self._keepalive - anyio.current_time()):
                return await events.next()
            await self._send(send, KEEPALIVE)
        return await events.next()


def keepalive_seconds(ctx: ApiContext) -> float | None:
    """The streams' keepalive interval; None when set to 0."""
    seconds = ctx.resolved.config.sse_keepalive_seconds
    return None if seconds == 0 else seconds
