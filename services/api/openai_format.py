"""OpenAI wire format for chat completions: response objects and SSE chunks."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec

from events.catalogue import ToolCall, Usage
from events.logprobs import TokenLogprob
from events.vocabulary import FinishReason
from services.api.responses import (
    AssistantMessage,
    CalledFunction,
    ChatCompletion,
    ChatTokenLogprob,
    Choice,
    ChoiceLogprobs,
    CompletionUsage,
    OpenAIFinishReason,
    PromptTokensDetails,
    ResponseToolCall,
    ShoalUsage,
    TopLogprob,
)


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


def openai_finish(finish_reason: FinishReason, called: bool = False) -> OpenAIFinishReason:
    """OpenAI has no `cancelled`; a cancelled task ends as `stop` (shoal_finish_reason says why).
    A completion that stopped after calling tools ends as `tool_calls`."""
    if finish_reason == "stop" and called:
        return "tool_calls"
    return "stop" if finish_reason == "cancelled" else finish_reason


def response_tool_call(call: ToolCall) -> ResponseToolCall:
    return ResponseToolCall(
        id=call.id, type="function", function=CalledFunction(name=call.name, arguments=call.arguments)
    )


def completion_usage(usage: Usage) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
        shoal=ShoalUsage(ttft_ms=usage.ttft_ms, prefill_tps=usage.prefill_tps, decode_tps=usage.decode_tps),
    )


def chat_logprobs(logprobs: list[TokenLogprob]) -> ChoiceLogprobs:
    """OpenAI's `choices[i].logprobs` of a chat completion (or of one streamed chunk)."""
    return ChoiceLogprobs(
        content=[
            ChatTokenLogprob(
                token=lp.token,
                logprob=lp.logprob,
                bytes=list(lp.token.encode()),
                top_logprobs=[
                    TopLogprob(token=t.token, logprob=t.logprob, bytes=list(t.token.encode())) for t in lp.top
                ],
            )
            for lp in logprobs
        ]
    )


class ChunkMaker:
    """Builds the chunks of one streamed completion (same id, created time and model)."""

    def __init__(self, completion_id: str, model: str) -> None:
        self.id = completion_id
        self.model = model
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def role(self, index: int = 0) -> bytes:
        """The opening delta of choice `index` (a request of `n` completions opens each)."""
        return sse(
            self._chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        )

    def content(self, text: str, logprobs: list[TokenLogprob] | None = None, index: int = 0) -> bytes:
        choice: dict[str, Any] = {"index": index, "delta": {"content": text}, "finish_reason": None}
        if logprobs is not None:
            choice["logprobs"] = msgspec.to_builtins(chat_logprobs(logprobs))
        return sse(self._chunk([choice]))

    def reasoning(self, text: str, index: int = 0) -> bytes:
        """A thinking model's reasoning, apart from its answer (`delta.reasoning_content`, as vLLM and mlx-lm send it)."""
        return sse(self._chunk([{"index": index, "delta": {"reasoning_content": text}, "finish_reason": None}]))

    def progress(self, processed: int, total: int, time_ms: float) -> bytes:
        """Prefill progress shaped like llama.cpp's `prompt_progress` (no choices)."""
        progress = {"total": total, "cache": 0, "processed": processed, "time_ms": round(time_ms, 1)}
        return sse(self._chunk([], prompt_progress=progress))

    def tool_call(self, index: int, call: ToolCall, choice: int = 0) -> bytes:
        """One whole call as one delta (the `openai` client assembles deltas by `index`)."""
        delta = {"tool_calls": [{"index": index, **msgspec.to_builtins(response_tool_call(call))}]}
        return sse(self._chunk([{"index": choice, "delta": delta, "finish_reason": None}]))

    def finish(self, finish_reason: FinishReason, called: bool = False, index: int = 0) -> bytes:
        return sse(
            self._chunk(
                [{"index": index, "delta": {}, "finish_reason": openai_finish(finish_reason, called)}],
                shoal_finish_reason=finish_reason,
            )
        )

    def usage(self, usage: Usage) -> bytes:
        return sse(self._chunk([], usage=msgspec.to_builtins(completion_usage(usage))))


def chat_choice(
    index: int,
    text: str,
    finish_reason: FinishReason,
    logprobs: list[TokenLogprob] | None = None,
    tool_calls: list[ToolCall] | None = None,
    reasoning: str | None = None,
) -> Choice:
    """One choice of a completion; with tool calls, `content` is None unless the model also wrote
    text. `logprobs` are of every generated token, the tool calls' text included."""
    return Choice(
        index=index,
        message=AssistantMessage(
            role="assistant",
            content=text if text.strip() or not tool_calls else None,
            tool_calls=[response_tool_call(c) for c in tool_calls] if tool_calls else None,
            reasoning_content=reasoning,
        ),
        finish_reason=openai_finish(finish_reason, bool(tool_calls)),
        logprobs=None if logprobs is None else chat_logprobs(logprobs),
    )


def completion(
    completion_id: str, model: str, choices: list[Choice], usage: Usage, finish_reason: FinishReason
) -> ChatCompletion:
    """A whole completion of one or more choices; `usage` counts the prompt once and every
    choice's tokens (OpenAI's); `finish_reason`: choice 0's, as shoal says it."""
    return ChatCompletion(
        id=completion_id,
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=completion_usage(usage),
        shoal_finish_reason=finish_reason,
    )
