"""Anthropic's Messages wire format: the response objects, the stream's events, and the error shape
(pure: no I/O; the route in `messages.py` feeds it a task's events).

A stream is `message_start`, `ping`, then per content block `content_block_start`, its deltas
(`text_delta` for text, one `input_json_delta` with a tool call's whole arguments) and
`content_block_stop`, then `message_delta` (stop_reason, stop_sequence, usage) and `message_stop`.
A failed task ends the stream with an `error` event, as Anthropic's does.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from events.catalogue import ChunkGenerated, LogEvent, PrefillStarted, TaskCompleted, TaskFailed, ToolCall, Usage
from events.vocabulary import FinishReason
from services.api.errors import failure_status
from services.api.tool_calls import Split, ToolCallSplitter

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
AnthropicErrorKind = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "timeout_error",
    "api_error",
    "overloaded_error",
]


class AnthropicErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    type: AnthropicErrorKind
    message: str


class AnthropicError(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["error"]
    error: AnthropicErrorDetail


_KIND_BY_STATUS: dict[int, AnthropicErrorKind] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_kind(status: int) -> AnthropicErrorKind:
    """Anthropic's error type for an HTTP status: a client's other mistakes are invalid requests,
    the server's other failures `api_error`."""
    return _KIND_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_error(status: int, message: str) -> AnthropicError:
    return AnthropicError(type="error", error=AnthropicErrorDetail(type=error_kind(status), message=message))


class TextContent(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="text"):
    text: str


class ToolUseContent(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Anthropic counts a prompt as input_tokens + cache reads (+ cache writes, none here)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0  # prompt tokens served from shoal's prefix cache


class Message(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[TextContent | ToolUseContent]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage
    shoal_finish_reason: FinishReason | None = None  # `cancelled` is `end_turn` to Anthropic's clients


class TokenCount(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int


def message_usage(usage: Usage) -> MessageUsage:
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return MessageUsage(
        input_tokens=usage.prompt_tokens - cached,
        output_tokens=usage.completion_tokens,
        cache_read_input_tokens=cached,
    )


def stop_reason(finish_reason: FinishReason, stop_sequence: str | None, called: bool) -> StopReason:
    """A task that stopped on one of the request's stop sequences ends `stop_sequence`; after
    calling tools, `tool_use`; cut by max_tokens, `max_tokens`; else (its end of turn, or a cancel)
    `end_turn`."""
    if finish_reason == "length":
        return "max_tokens"
    if stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if called else "end_turn"


def tool_use(call: ToolCall) -> ToolUseContent:
    """A call's arguments as an object (the splitter only releases calls whose body is JSON; a
    call whose arguments are not an object gets them under `arguments`, never dropped)."""
    arguments = json.loads(call.arguments)
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    return ToolUseContent(id=call.id, name=call.name, input=arguments)  # pyright: ignore[reportUnknownArgumentType]


def message(message_id: str, model: str, split: Split, terminal: TaskCompleted) -> Message:
    content: list[TextContent | ToolUseContent] = [TextContent(text=split.content)] if split.content else []
    content += [tool_use(call) for call in split.calls]
    return Message(
        id=message_id,
        type="message",
        role="assistant",
        content=content,
        model=model,
        stop_reason=stop_reason(terminal.finish_reason, terminal.stop_sequence, bool(split.calls)),
        stop_sequence=terminal.stop_sequence,
        usage=message_usage(terminal.usage),
        shoal_finish_reason=terminal.finish_reason,
    )


def sse_event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def error_event(status: int, message: str) -> bytes:
    return sse_event("error", msgspec.to_builtins(anthropic_error(status, message)))


class MessageEvents:
    """The events of one streamed message, from its task's events; `splitter` is there when the
    request offered tools. `message_start` waits for the task's `PrefillStarted`, whose prompt size
    (and the prefix cache's share of it) is the runner's own, so its usage is the one `message_delta`
    ends with; keepalive comments hold the connection until then."""

    def __init__(self, message_id: str, model: str, splitter: ToolCallSplitter | None) -> None:
        self.message_id, self.model = message_id, model
        self.splitter = splitter
        self.started = False  # message_start was sent
        self.blocks = 0  # content blocks started
        self.text_open = False  # the last block started is a text block still open
        self.calls = 0

    def opening(self) -> list[bytes]:
        return []

    def _start(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]:
        """`message_start` and a `ping`, once."""
        if self.started:
            return []
        self.started = True
        usage = message_usage(Usage(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens))
        start: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": msgspec.to_builtins(usage),
        }
        return [
            sse_event("message_start", {"type": "message_start", "message": start}),
            sse_event("ping", {"type": "ping"}),
        ]

    def chunks(self, event: LogEvent) -> list[bytes]:
        match event:
            case PrefillStarted(prompt_tokens=prompt_tokens, cached_tokens=cached):
                return self._start(prompt_tokens, cached)
            case ChunkGenerated(text=text) if self.splitter is not None:
                return [*self._start(0, 0), *self._released(self.splitter.feed(text))]  # never before its start
            case ChunkGenerated(text=text) if text:
                return [*self._start(0, 0), *self._text(text)]
            case TaskCompleted(usage=usage):
                opened = self._start(usage.prompt_tokens, usage.cached_tokens)  # ended before its prefill
                held = [] if self.splitter is None else self._released(self.splitter.finish())
                return [*opened, *held, *self._close_text(), *self._end(event)]
            case TaskFailed():
                status, _, _ = failure_status(event)
                return [error_event(status, event.error)]
            case _:
                return []

    def _released(self, split: Split) -> list[bytes]:
        out = self._text(split.content) if split.content else []
        for call in split.calls:
            out += self._tool_use(call)
        return out

    def _text(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if not self.text_open:
            start = {"type": "content_block_start", "index": self.blocks, "content_block": {"type": "text", "text": ""}}
            out.append(sse_event("content_block_start", start))
            self.blocks += 1
            self.text_open = True
        delta = {"type": "content_block_delta", "index": self.blocks - 1, "delta": {"type": "text_delta", "text": text}}
        return [*out, sse_event("content_block_delta", delta)]

    def _close_text(self) -> list[bytes]:
        if not self.text_open:
            return []
        self.text_open = False
        return [sse_event("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def _tool_use(self, call: ToolCall) -> list[bytes]:
        """A whole call as one block: its start (input empty, as Anthropic's), its arguments as one
        `input_json_delta`, its stop."""
        out = self._close_text()
        index = self.blocks
        self.blocks += 1
        self.calls += 1
        block: dict[str, Any] = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        arguments = json.dumps(tool_use(call).input, separators=(",", ":"))
        delta = {"type": "input_json_delta", "partial_json": arguments}
        return [
            *out,
            sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}),
            sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            sse_event("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]

    def _end(self, completed: TaskCompleted) -> list[bytes]:
        stop_sequence = completed.stop_sequence
        reason = stop_reason(completed.finish_reason, stop_sequence, self.calls > 0)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
            "usage": msgspec.to_builtins(message_usage(completed.usage)),
            "shoal_finish_reason": completed.finish_reason,
        }
        return [sse_event("message_delta", delta), sse_event("message_stop", {"type": "message_stop"})]
