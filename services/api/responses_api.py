"""POST /v1/responses (OpenAI's Responses API): the request becomes the chat request it amounts to
(`to_chat_request`), so its task is the same `TaskCreated` a chat request makes, admitted and run
by `task_stream` as chat's is; only the answer's shape is its own (`ResponseBuilder`)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response as HttpResponse

from events.catalogue import ChunkGenerated, LogEvent, TaskCompleted, TaskCreated, TaskFailed, TaskParams
from services.api.auth import caller_of
from services.api.context import ApiContext
from services.api.output_split import OutputPiece, OutputSplitter, output_splitter, split_output
from services.api.prompts import PromptModel
from services.api.responses_api_format import Event, Response, ResponseBuilder, event_sse
from services.api.responses_api_schemas import (
    PlainText,
    ResponsesRequest,
    TextConfig,
    decode_responses_request,
    to_chat_request,
)
from services.api.schemas import RequestProblem, to_task_off_loop
from services.api.task_stream import Collected, admit, check_model, read_body, respond

NANOS = 1_000_000_000


async def create_response(request: Request, ctx: ApiContext) -> HttpResponse:
    config = ctx.resolved.config
    body = decode_responses_request(await read_body(request, config.max_body_bytes))
    check_model(ctx, body.model)
    key, lane = caller_of(request).key_id, ctx.prompt_lanes.grammars
    try:
        chat = to_chat_request(body)
        messages, params = await to_task_off_loop(chat, max_tokens_limit=config.max_tokens_limit, lane=lane, key=key)
        task = await admit(ctx, body.model, params, key, messages=messages)
    except RequestProblem as problem:
        raise in_responses_terms(problem) from problem
    start = in_progress(body, task)
    prompt_model = await ctx.prompt_model(body.model)
    markers = None if prompt_model is None else prompt_model.reasoning
    count = token_counter(prompt_model)
    parser = await ctx.tool_parser(body.model)
    max_calls = 1 if chat.parallel_tool_calls is False else None

    def answer(outcome: Collected, terminal: TaskCompleted) -> Response:
        builder = ResponseBuilder(start)
        feed(builder, split_output(output_splitter(task, markers, parser, max_calls), outcome.text))
        _, final = builder.finished(terminal.finish_reason, terminal.usage, count(builder.reasoning_text))
        return final

    shape = (
        ResponsesShape(ResponseBuilder(start), output_splitter(task, markers, parser, max_calls), count)
        if body.stream
        else None
    )
    return await respond(ctx, task, request, shape=shape, answer=answer)


class ResponsesShape:
    """A task's events as the Responses API's stream events."""

    def __init__(self, builder: ResponseBuilder, splitter: OutputSplitter, count: Callable[[str], int]) -> None:
        self.builder, self.splitter, self.count = builder, splitter, count

    def opening(self) -> list[bytes]:
        return [event_sse(e) for e in self.builder.opening()]

    def chunks(self, event: LogEvent) -> list[bytes]:
        builder, splitter = self.builder, self.splitter
        match event:
            case ChunkGenerated():
                return [event_sse(e) for e in feed(builder, splitter.feed(event.text))]
            case TaskCompleted():
                held = feed(builder, splitter.finish())
                ending, _ = builder.finished(event.finish_reason, event.usage, self.count(builder.reasoning_text))
                return [event_sse(e) for e in [*held, *ending]]
            case TaskFailed():
                return [event_sse(e) for e in builder.failed(event.error, invalid_request=event.invalid_request)]
            case _:
                return []


def feed(builder: ResponseBuilder, piece: OutputPiece) -> list[Event]:
    """What a splitter released, in the order it holds: reasoning, the answer, then each whole call."""
    events = [*builder.reasoning(piece.reasoning), *builder.text(piece.content)]
    for call in piece.calls:
        events.extend(builder.call(call))
    return events


def token_counter(model: PromptModel | None) -> Callable[[str], int]:
    """How many tokens a text is, by the model's tokenizer (reasoning is only split where the API
    has it: with none, there is no reasoning to count)."""
    if model is None:
        return lambda text: 0
    tokenizer = model.tokenizer
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


def in_progress(body: ResponsesRequest, task: TaskCreated) -> Response:
    """The response as `response.created` shows it: what was asked, nothing made yet."""
    params: TaskParams = task.params
    return Response(
        id=f"resp_{task.task_id}",
        object="response",
        created_at=task.env.wall_time // NANOS,
        status="in_progress",
        model=body.model,
        output=[],
        usage=None,
        error=None,
        incomplete_details=None,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        tools=list(body.tools or []),
        tool_choice=body.tool_choice or ("auto" if body.tools else "none"),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        text=body.text or TextConfig(format=PlainText()),
        store=False,
        metadata=dict(body.metadata or {}),
        shoal_finish_reason=None,
    )


# The chat request's names in what `to_task` and `admit` refuse, as this request spells them. A
# message's index is not carried over (`instructions` and joined function calls shift it).
_RENAMED = (
    ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"),
    ("messages", "input"),
    ("reasoning_effort", "reasoning.effort"),
)


def in_responses_terms(problem: RequestProblem) -> RequestProblem:
    """A refusal of the chat request, naming the Responses request's field (`text.format`, not
    `response_format`)."""
    param, message = problem.param, problem.message
    for chat_name, name in _RENAMED:
        if param is not None and param.startswith(chat_name):
            param = name
        message = message.replace(f"{chat_name}=", f"{name}=").replace(f"{chat_name} ", f"{name} ")
    return RequestProblem(problem.status, message, param=param, code=problem.code, headers=problem.headers)
