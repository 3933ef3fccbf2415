"""POST /v1/messages (Anthropic's Messages API) and /v1/messages/count_tokens.

A Messages request becomes the `TaskCreated` a chat completion would (`messages_schemas.to_task`:
the same chat messages, tools and forced-call grammar), admitted, run and streamed by
`task_stream` as chat's is; only the wire format differs (`messages_format`), errors included
(`anthropic_errors`). Tool calls are split out of the text as chat's are (`tool_calls`).
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import Response

from events.catalogue import ChatMessage, TaskCompleted, TaskCreated, TaskParams
from events.constraints import ToolFunction
from events.ids import KeyId
from services.api.anthropic_errors import AnthropicStreamErrors, anthropic_error_response
from services.api.auth import caller_of
from services.api.context import ApiContext
from services.api.errors import failure_status
from services.api.fair_lane import FairLane
from services.api.messages_format import MessageEvents, TokenCount, message
from services.api.messages_schemas import (
    CountTokensRequest,
    MessagesRequest,
    chat_messages,
    decode_count_tokens_request,
    decode_messages_request,
    one_call_at_most,
    to_task,
    tools_and_constraint,
)
from services.api.responses import json_response
from services.api.schemas import RequestProblem
from services.api.task_stream import (
    TaskStream,
    admit,
    check_model,
    collect,
    keepalive_seconds,
    read_body,
    run_task,
)
from services.api.tool_calls import Split, ToolCallSplitter, split_text, task_call_splitter
from services.api.tool_parsers import ToolParser

MESSAGE_ID_PREFIX = "msg_"  # a message's id is its task's, so /v1/tasks/{id} finds it


async def create_message(request: Request, ctx: ApiContext) -> Response:
    config = ctx.resolved.config
    body = decode_messages_request(await read_body(request, config.max_body_bytes))
    check_model(ctx, body.model)
    key = caller_of(request).key_id
    messages, params = await _to_task(body, config.max_tokens_limit, ctx.prompt_lanes.grammars, key)
    task = await admit(ctx, body.model, params, key, messages=messages)
    message_id = f"{MESSAGE_ID_PREFIX}{task.task_id}"
    headers = {"x-shoal-task-id": str(task.task_id)}
    parser = await ctx.tool_parser(body.model)
    if body.stream:
        shape = MessageEvents(message_id, body.model, _tool_call_splitter(task, parser, one_call_at_most(body)))
        return TaskStream(ctx, task, shape, headers, keepalive_seconds(ctx), errors=AnthropicStreamErrors())
    outcome = await run_task(ctx, task, request.receive, collect)
    if outcome is None:
        return Response(status_code=499)  # nobody reads it: the client went away
    terminal = outcome.terminal
    if not isinstance(terminal, TaskCompleted):
        status, _, _ = failure_status(terminal)
        return anthropic_error_response(status, terminal.error, headers)
    splitter = _tool_call_splitter(task, parser, one_call_at_most(body))
    split = Split(content=outcome.text) if splitter is None else split_text(splitter, outcome.text)
    return json_response(message(message_id, body.model, split, terminal), headers=headers)


async def count_tokens(request: Request, ctx: ApiContext) -> Response:
    """The prompt's tokens as the runner will see them: the messages and tools in the model's
    chat template, counted by its tokenizer (never estimated: with no tokenizer here, a 503)."""
    config = ctx.resolved.config
    body = decode_count_tokens_request(await read_body(request, config.max_body_bytes))
    check_model(ctx, body.model)
    key = caller_of(request).key_id
    lane = ctx.prompt_lanes.grammars
    messages, tools = await lane.run_sync(key, _counted_prompt, body) if body.tools else _counted_prompt(body)
    model = await ctx.prompt_model(body.model)
    if model is None:
        raise RequestProblem(
            503,
            f"cannot count tokens: the tokenizer of {body.model!r} is not on this API's host yet "
            "(its model directory appears once a worker here has it); try again when the model is ready",
            code="tokenizer_unavailable",
        )
    size = await ctx.prompt_lanes.size(key, model, messages, tools, None)
    return json_response(TokenCount(input_tokens=size))


def _counted_prompt(body: CountTokensRequest) -> tuple[list[ChatMessage], list[ToolFunction]]:
    """The messages and the tools the template shows (the forced call's grammar checked too)."""
    tools, _ = tools_and_constraint(body)
    return chat_messages(body), tools


async def _to_task(
    body: MessagesRequest, max_tokens_limit: int, lane: FairLane, key: KeyId
) -> tuple[list[ChatMessage], TaskParams]:
    """`to_task`, on a thread of `lane` in `key`'s turn when it offers tools: checking a forced
    call's grammar can take llguidance a second (as chat's `to_task_off_loop`)."""
    if not body.tools:
        return to_task(body, max_tokens_limit=max_tokens_limit)
    return await lane.run_sync(key, functools.partial(to_task, body, max_tokens_limit=max_tokens_limit))


def _tool_call_splitter(task: TaskCreated, parser: ToolParser | None, one_call: bool) -> ToolCallSplitter | None:
    """Only a task that offered the model tools has tool calls to look for in its text (read by
    the parser of the model's format, when it has one shoal knows)."""
    if not task.params.tools or parser is None:
        return None
    return task_call_splitter(task, parser, "toolu_", 1 if one_call else None)
