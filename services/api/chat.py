"""POST /v1/chat/completions: validate, publish `TaskCreated`, turn the task's events into an
OpenAI response (JSON or SSE). How a task is admitted, run and streamed is `task_stream`'s; a
thinking model's reasoning is split out of its text (`reasoning_content`), and a task that offered
the model tools has its tool calls split out of the answer (`tool_calls`): `output_split`."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from events.catalogue import ChunkGenerated, LogEvent, PrefillProgress, TaskCompleted, TaskCreated, TaskFailed
from events.ids import TaskId
from events.logprobs import TokenLogprob
from services.api.auth import caller_of
from services.api.context import ApiContext
from services.api.errors import error_body, failure_status
from services.api.openai_format import DONE, ChunkMaker, completion, sse
from services.api.output_split import OutputPiece, OutputSplitter, output_splitter, split_output
from services.api.responses import ChatCompletion
from services.api.schemas import ChatCompletionRequest, decode_chat_request, to_task_off_loop
from services.api.task_stream import Collected, admit, check_model, read_body, respond


async def chat_completions(request: Request, ctx: ApiContext) -> Response:
    config = ctx.resolved.config
    chat = decode_chat_request(await read_body(request, config.max_body_bytes))
    check_model(ctx, chat.model)
    key, lane = caller_of(request).key_id, ctx.prompt_lanes.grammars
    messages, params = await to_task_off_loop(chat, max_tokens_limit=config.max_tokens_limit, lane=lane, key=key)
    task = await admit(ctx, chat.model, params, key, messages=messages)
    markers, parser = await ctx.reasoning_markers(chat.model), await ctx.tool_parser(chat.model)
    max_calls = 1 if chat.parallel_tool_calls is False else None

    def answer(outcome: Collected, terminal: TaskCompleted) -> ChatCompletion:
        split = split_output(output_splitter(task, markers, parser, max_calls), outcome.text)
        completion_id = f"chatcmpl-{task.task_id}"
        finish, usage = terminal.finish_reason, terminal.usage
        reasoning = split.reasoning or None
        return completion(
            completion_id, chat.model, split.content, finish, usage, outcome.logprobs, split.calls, reasoning
        )

    shape = _ChatShape(ctx, chat, task, output_splitter(task, markers, parser, max_calls)) if chat.stream else None
    return await respond(ctx, task, request, shape=shape, wants_progress=chat.wants_progress, answer=answer)


class _ChatShape:
    """A chat task's events as `chat.completion.chunk`s."""

    def __init__(
        self, ctx: ApiContext, chat: ChatCompletionRequest, task: TaskCreated, splitter: OutputSplitter
    ) -> None:
        self.ctx, self.chat, self.task_id = ctx, chat, task.task_id
        self.maker = ChunkMaker(f"chatcmpl-{task.task_id}", chat.model)
        # none when the text is all content: each event's text (and logprobs) as it came
        self.splitter = splitter if splitter.reasoning is not None or splitter.tools is not None else None

    def opening(self) -> list[bytes]:
        return [self.maker.role()]

    def chunks(self, event: LogEvent) -> list[bytes]:
        ctx, chat, task_id, maker = self.ctx, self.chat, self.task_id, self.maker
        match event:
            case PrefillProgress() if chat.wants_progress and _is_last_rank(ctx, task_id, event.rank):
                since_ms = _since_created_ms(ctx, task_id, event.env.wall_time)
                return [maker.progress(event.processed, event.total, since_ms)]
            case ChunkGenerated() if self.splitter is not None:
                return _split_chunks(maker, self.splitter, self.splitter.feed(event.text), event.logprobs)
            case ChunkGenerated() if event.text or event.logprobs:
                return [maker.content(event.text, event.logprobs)]
            case TaskCompleted():
                usage = [maker.usage(event.usage)] if chat.wants_usage else []
                held = (
                    [] if self.splitter is None else _split_chunks(maker, self.splitter, self.splitter.finish(), None)
                )
                called = self.splitter is not None and self.splitter.calls_made > 0
                return [*held, maker.finish(event.finish_reason, called), *usage, DONE]
            case TaskFailed():
                return [failed_chunk(event)]
            case _:
                return []


def _split_chunks(
    maker: ChunkMaker, splitter: OutputSplitter, split: OutputPiece, logprobs: list[TokenLogprob] | None
) -> list[bytes]:
    """What the splitter released: reasoning, content (with the logprobs of the event's tokens,
    even when it held their text back), then each whole call as a delta."""
    first = splitter.calls_made - len(split.calls)
    reasoning = [maker.reasoning(split.reasoning)] if split.reasoning else []
    content = [maker.content(split.content, logprobs)] if split.content or logprobs else []
    return [*reasoning, *content, *(maker.tool_call(first + i, call) for i, call in enumerate(split.calls))]


def failed_chunk(event: TaskFailed) -> bytes:
    """A failed task's error as the stream's last event, then [DONE]."""
    _, kind, code = failure_status(event)
    return sse(msgspec.to_builtins(error_body(event.error, kind=kind, code=code))) + DONE


def _is_last_rank(ctx: ApiContext, task_id: TaskId, rank: int) -> bool:
    task = ctx.hub.state.tasks.get(task_id)
    instance = ctx.hub.state.instances.get(task.instance_id) if task and task.instance_id else None
    return instance is not None and rank == instance.world_size - 1


def _since_created_ms(ctx: ApiContext, task_id: TaskId, at: int) -> float:
    task = ctx.hub.state.tasks.get(task_id)
    return (at - task.created_at) / 1e6 if task is not None else 0.0
