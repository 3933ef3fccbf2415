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
from events.vocabulary import FinishReason
from services.api.auth import caller_of
from services.api.context import ApiContext
from services.api.errors import error_body, failure_status
from services.api.openai_format import DONE, ChunkMaker, chat_choice, completion, sse
from services.api.output_split import OutputPiece, OutputSplitter, output_splitter, split_output
from services.api.responses import ChatCompletion, Choice
from services.api.schemas import ChatCompletionRequest, decode_chat_request, to_task_off_loop
from services.api.task_stream import Collected, admit, check_model, finish_reasons, read_body, respond


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
        choices: list[Choice] = []
        for index, (got, finish) in enumerate(zip(outcome.choices, finish_reasons(terminal), strict=False)):
            split = split_output(output_splitter(task, markers, parser, max_calls), got.text)
            reasoning = split.reasoning or None
            choices.append(chat_choice(index, split.content, finish, got.logprobs, split.calls, reasoning))
        return completion(f"chatcmpl-{task.task_id}", chat.model, choices, terminal.usage, terminal.finish_reason)

    splitters = [output_splitter(task, markers, parser, max_calls) for _ in range(chat.choices)]
    shape = _ChatShape(ctx, chat, task, splitters) if chat.stream else None
    return await respond(ctx, task, request, shape=shape, answer=answer)


class _ChatShape:
    """A chat task's events as `chat.completion.chunk`s; a task of `n` completions streams each
    choice's deltas under its `index`, every choice's finish, then the usage of all of them."""

    def __init__(
        self, ctx: ApiContext, chat: ChatCompletionRequest, task: TaskCreated, splitters: list[OutputSplitter]
    ) -> None:
        self.ctx, self.chat, self.task_id = ctx, chat, task.task_id
        self.maker = ChunkMaker(f"chatcmpl-{task.task_id}", chat.model)
        # none when the text is all content: each event's text (and logprobs) as it came
        first = splitters[0]
        self.splitters = splitters if first.reasoning is not None or first.tools is not None else None

    def opening(self) -> list[bytes]:
        return [self.maker.role(index) for index in range(self.chat.choices)]

    def chunks(self, event: LogEvent) -> list[bytes]:
        ctx, chat, task_id, maker = self.ctx, self.chat, self.task_id, self.maker
        match event:
            case PrefillProgress() if chat.wants_progress and _is_last_rank(ctx, task_id, event.rank):
                since_ms = _since_created_ms(ctx, task_id, event.env.wall_time)
                return [maker.progress(event.processed, event.total, since_ms)]
            case ChunkGenerated() if self.splitters is not None and event.choice < len(self.splitters):
                splitter = self.splitters[event.choice]
                return _split_chunks(maker, splitter, splitter.feed(event.text), event.logprobs, event.choice)
            case ChunkGenerated() if event.text or event.logprobs:
                return [maker.content(event.text, event.logprobs, event.choice)]
            case TaskCompleted():
                usage = [maker.usage(event.usage)] if chat.wants_usage else []
                ends = [chunk for i, f in enumerate(finish_reasons(event)) for chunk in self._finish(i, f)]
                return [*ends, *usage, DONE]
            case TaskFailed():
                return [failed_chunk(event)]
            case _:
                return []

    def _finish(self, index: int, finish_reason: FinishReason) -> list[bytes]:
        """What choice `index`'s splitter still held, then its finish."""
        maker, splitter = self.maker, None if self.splitters is None else self.splitters[index]
        held = [] if splitter is None else _split_chunks(maker, splitter, splitter.finish(), None, index)
        called = splitter is not None and splitter.calls_made > 0
        return [*held, maker.finish(finish_reason, called, index)]


def _split_chunks(
    maker: ChunkMaker,
    splitter: OutputSplitter,
    split: OutputPiece,
    logprobs: list[TokenLogprob] | None,
    choice: int = 0,
) -> list[bytes]:
    """What the splitter released: reasoning, content (with the logprobs of the event's tokens,
    even when it held their text back), then each whole call as a delta."""
    first = splitter.calls_made - len(split.calls)
    reasoning = [maker.reasoning(split.reasoning, choice)] if split.reasoning else []
    content = [maker.content(split.content, logprobs, choice)] if split.content or logprobs else []
    calls = [maker.tool_call(first + i, call, choice) for i, call in enumerate(split.calls)]
    return [*reasoning, *content, *calls]


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
