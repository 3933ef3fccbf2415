"""POST /v1/completions: OpenAI's legacy text completion, on the same task path as chat.

The prompt goes to the runner as it is (text or token ids), without the chat template. `echo`
puts the prompt's text before the completion: the text as sent, or token ids decoded with the
model's tokenizer, which the API then needs on its own machine.
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response

from events.catalogue import ChunkGenerated, LogEvent, RawPrompt, TaskCompleted, TaskFailed
from events.ids import TaskId
from services.api.auth import caller_of
from services.api.chat import failed_chunk
from services.api.completions_format import TextChunkMaker, completion_logprobs, text_choice, text_completion
from services.api.context import ApiContext
from services.api.openai_format import DONE
from services.api.responses import TextCompletion
from services.api.schemas import CompletionRequest, RequestProblem, completion_params, decode_completion_request
from services.api.task_stream import Collected, admit, check_model, finish_reasons, read_body, respond


async def completions(request: Request, ctx: ApiContext) -> Response:
    config = ctx.resolved.config
    body = decode_completion_request(await read_body(request, config.max_body_bytes))
    check_model(ctx, body.model)
    params = completion_params(body, max_tokens_limit=config.max_tokens_limit)
    prompt = body.single_prompt()
    task = await admit(ctx, body.model, params, caller_of(request).key_id, messages=[], raw_prompt=prompt)
    echoed = await _echo_text(ctx, body.model, prompt) if body.echo else ""

    def answer(outcome: Collected, terminal: TaskCompleted) -> TextCompletion:
        choices = [
            text_choice(
                index,
                echoed + got.text,
                finish,
                None if got.logprobs is None else completion_logprobs(got.logprobs, len(echoed)),
            )
            for index, (got, finish) in enumerate(zip(outcome.choices, finish_reasons(terminal), strict=False))
        ]
        return text_completion(f"cmpl-{task.task_id}", body.model, choices, terminal.usage, terminal.finish_reason)

    shape = _TextShape(body, task.task_id, echoed) if body.stream else None
    return await respond(ctx, task, request, shape=shape, answer=answer)


async def _echo_text(ctx: ApiContext, model_name: str, prompt: RawPrompt) -> str:
    if isinstance(prompt, str):
        return prompt
    model = await ctx.prompt_model(model_name)
    if model is None:
        raise RequestProblem(
            400,
            "echo of a token-id prompt needs the model's tokenizer, which this API does not have: "
            "send the prompt as text, or leave echo out",
            param="echo",
        )
    return await anyio.to_thread.run_sync(model.tokenizer.decode, prompt)


class _TextShape:
    """A completion task's events as `text_completion` chunks; the echoed prompt comes first (in
    each choice, for a task of `n`), each choice's text under its `index`."""

    def __init__(self, body: CompletionRequest, task_id: TaskId, echoed: str) -> None:
        self.body, self.echoed = body, echoed
        self.maker = TextChunkMaker(f"cmpl-{task_id}", body.model, offset=len(echoed))

    def opening(self) -> list[bytes]:
        return [self.maker.text(self.echoed, index=i) for i in range(self.body.choices)] if self.echoed else []

    def chunks(self, event: LogEvent) -> list[bytes]:
        match event:
            case ChunkGenerated() if event.text or event.logprobs:
                return [self.maker.text(event.text, event.logprobs, event.choice)]
            case TaskCompleted():
                usage = [self.maker.usage(event.usage)] if self.body.wants_usage else []
                ends = [self.maker.finish(finish, i) for i, finish in enumerate(finish_reasons(event))]
                return [*ends, *usage, DONE]
            case TaskFailed():
                return [failed_chunk(event)]
            case _:
                return []
