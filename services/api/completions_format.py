"""OpenAI wire format for the legacy `/v1/completions`: the response object and its SSE chunks."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from events.catalogue import Usage
from events.logprobs import TokenLogprob
from events.vocabulary import FinishReason
from services.api.openai_format import completion_usage, openai_finish, sse
from services.api.responses import CompletionChoice, CompletionLogprobs, TextCompletion


def completion_logprobs(logprobs: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    """The tokens' logprobs in the legacy shape; `offset`: where the first token starts in the text."""
    offsets: list[int] = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.token)
    return CompletionLogprobs(
        tokens=[lp.token for lp in logprobs],
        token_logprobs=[lp.logprob for lp in logprobs],
        top_logprobs=[{t.token: t.logprob for t in lp.top} for lp in logprobs],
        text_offset=offsets,
    )


class TextChunkMaker:
    """Builds the chunks of one streamed text completion; keeps each choice's text offset of its
    next token (every choice starts after the echoed prompt, `offset`)."""

    def __init__(self, completion_id: str, model: str, *, offset: int = 0) -> None:
        self.id = completion_id
        self.model = model
        self.created = int(time.time())
        self.start = offset
        self.offsets: dict[int, int] = {}  # by choice

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return sse(body)

    def text(self, text: str, logprobs: list[TokenLogprob] | None = None, index: int = 0) -> bytes:
        shaped = None
        if logprobs is not None:
            offset = self.offsets.get(index, self.start)
            shaped = msgspec.to_builtins(completion_logprobs(logprobs, offset))
            self.offsets[index] = offset + sum(len(lp.token) for lp in logprobs)
        return self._chunk([{"index": index, "text": text, "logprobs": shaped, "finish_reason": None}])

    def finish(self, finish_reason: FinishReason, index: int = 0) -> bytes:
        choice = {"index": index, "text": "", "logprobs": None, "finish_reason": openai_finish(finish_reason)}
        return self._chunk([choice], shoal_finish_reason=finish_reason)

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage=msgspec.to_builtins(completion_usage(usage)))


def text_choice(
    index: int, text: str, finish_reason: FinishReason, logprobs: CompletionLogprobs | None
) -> CompletionChoice:
    return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=openai_finish(finish_reason))


def text_completion(
    completion_id: str, model: str, choices: list[CompletionChoice], usage: Usage, finish_reason: FinishReason
) -> TextCompletion:
    """`usage` counts the prompt once and every choice's tokens (OpenAI's); `finish_reason`: choice 0's."""
    return TextCompletion(
        id=completion_id,
        object="text_completion",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=completion_usage(usage),
        shoal_finish_reason=finish_reason,
    )
