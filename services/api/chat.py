"""POST /v1/chat/completions: validate, publish `TaskCreated`, turn the task's events into an
OpenAI response (JSON or SSE). How a task is admitted, run and streamed is `task_stream`'s."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from events.catalogue import ChunkGenerated, LogEvent, PrefillProgress, TaskCompleted, TaskFailed
from events.ids import TaskId
from services.api.auth import caller_of
from services.api.context import ApiContext
from services.api.errors import error_body
from services.api.openai_format import DONE, ChunkMaker, completion, sse
from services.api.responses import ChatCompletion
from services.api.schemas import ChatCompletionRequest, decode_chat_request, to_task
from services.api.task_stream import Collected, admit, check_model, read_body, respond


async def chat_completions(request: Request, ctx: ApiContext) -> Response:
    config = ctx.resolved.config
    chat = decode_chat_request(await read_body(request, config.max_body_bytes))
    check_model(ctx, chat.model)
    messages, params = to_task(chat, max_tokens_limit=config.max_tokens_limit)
    task = await admit(ctx, chat.model, params, caller_of(request).key_id, messages=messages)

    def answer(outcome: Collected, terminal: TaskCompleted) -> ChatCompletion:
        completion_id = f"chatcmpl-{task.task_id}"
        usage = terminal.usage
        return completion(completion_id, chat.model, outcome.text, terminal.finish_reason, usage, outcome.logprobs)

    shape = _ChatShape(ctx, chat, task.task_id) if chat.stream else None
    return await respond(ctx, task, request, shape=shape, wants_progress=chat.wants_progress, answer=answer)


class _ChatShape:
    """A chat task's events as `chat.completion.chunk`s."""

    def __init__(self, ctx: ApiContext, chat: ChatCompletionRequest, task_id: TaskId) -> None:
        self.ctx, self.chat, self.task_id = ctx, chat, task_id
        self.maker = ChunkMaker(f"chatcmpl-{task_id}", chat.model)

    def opening(self) -> list[bytes]:
        return [self.maker.role()]

    def chunks(self, event: LogEvent) -> list[bytes]:
        ctx, chat, task_id, maker = self.ctx, self.chat, self.task_id, self.maker
        match event:
            case PrefillProgress() if chat.wants_progress and _is_last_rank(ctx, task_id, event.rank):
                since_ms = _since_created_ms(ctx, task_id, event.env.wall_time)
                return [maker.progress(event.processed, event.total, since_ms)]
            case ChunkGenerated() if event.text or event.logprobs:
                return [maker.content(event.text, event.logprobs)]
            case TaskCompleted():
                usage = [maker.usage(event.usage)] if chat.wants_usage else []
                return [maker.finish(event.finish_reason), *usage, DONE]
            case TaskFailed():
                return [failed_chunk(event)]
            case _:
                return []


def failed_chunk(event: TaskFailed) -> bytes:
    """A failed task's error as the stream's last event, then [DONE]."""
    return sse(msgspec.to_builtins(error_body(event.error, kind="task_failed", code="task_failed"))) + DONE


def _is_last_rank(ctx: ApiContext, task_id: TaskId, rank: int) -> bool:
    task = ctx.hub.state.tasks.get(task_id)
    instance = ctx.hub.state.instances.get(task.instance_id) if task and task.instance_id else None
    return instance is not None and rank == instance.world_size - 1


def _since_created_ms(ctx: ApiContext, task_id: TaskId, at: int) -> float:
    task = ctx.hub.state.tasks.get(task_id)
    return (at - task.created_at) / 1e6 if task is not None else 0.0
