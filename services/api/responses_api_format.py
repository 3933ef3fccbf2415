"""A task's output as an OpenAI Responses object and its stream of events (pure: no I/O).

`ResponseBuilder` is fed what the task produced, in order (text, whole tool calls, the end), and
returns the stream's events for each; the JSON answer of a request not streamed is the same
builder's final `Response`, so both say the same thing. Every event carries `sequence_number`, from
0 in the order sent. Output items, in the order the model wrote them: a `message` (its one
`output_text` part) for text, a `function_call` per call; text after a call opens a new message.

How a task's end maps: `stop` is `completed` (`response.completed`), `length` is `incomplete` with
`incomplete_details.reason` `max_output_tokens`, `cancelled` is `cancelled` (`response.incomplete`:
the Responses API has no cancelled event); a failed task is `failed` (`response.failed`, with
`error`). `shoal_finish_reason` says which of shoal's reasons it was, as chat's does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from events.catalogue import ToolCall, Usage
from events.vocabulary import FinishReason
from services.api.responses_api_schemas import FunctionTool, ResponsesToolChoice, TextConfig

ResponseStatus = Literal["in_progress", "completed", "incomplete", "cancelled", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]]  # always empty: shoal cites nothing
    logprobs: list[dict[str, Any]]  # always empty: not computed for responses


class OutputMessage(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="message"):
    id: str
    role: Literal["assistant"]
    status: ItemStatus
    content: list[OutputText]


class FunctionCallItem(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str  # what the client's function_call_output names
    name: str
    arguments: str  # JSON text
    status: ItemStatus


class ReasoningText(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="reasoning"):
    """A thinking model's reasoning, as it wrote it (no summary is made)."""

    id: str
    status: ItemStatus
    summary: list[dict[str, Any]]  # always empty
    content: list[ReasoningText]


OutputItem = OutputMessage | FunctionCallItem | ReasoningItem


class InputTokensDetails(msgspec.Struct, frozen=True, kw_only=True):
    cached_tokens: int  # prompt tokens served from the prefix cache


class OutputTokensDetails(msgspec.Struct, frozen=True, kw_only=True):
    reasoning_tokens: int


class ResponseUsage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct, frozen=True, kw_only=True):
    reason: Literal["max_output_tokens"]


class ResponseError(msgspec.Struct, frozen=True, kw_only=True):
    code: Literal["server_error", "invalid_prompt"]
    message: str


class Response(msgspec.Struct, frozen=True, kw_only=True):
    """OpenAI's `response` object, with what the request asked for echoed back."""

    id: str
    object: Literal["response"]
    created_at: int
    status: ResponseStatus
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[FunctionTool]
    tool_choice: ResponsesToolChoice
    parallel_tool_calls: bool
    text: TextConfig
    store: bool  # always false: nothing is kept
    metadata: dict[str, str]
    shoal_finish_reason: FinishReason | None  # None until it ends, and for a failed task


def response_usage(usage: Usage, reasoning_tokens: int = 0) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=min(reasoning_tokens, usage.completion_tokens)),
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
    )


Event = dict[str, Any]
_STATUS_OF: dict[FinishReason, ResponseStatus] = {"stop": "completed", "length": "incomplete", "cancelled": "cancelled"}


@dataclass(slots=True)
class _OpenMessage:
    index: int  # its place in `output`
    item_id: str
    text: str = ""
    reasoning: bool = False  # a reasoning item (its part `reasoning_text`), else a message (`output_text`)


@dataclass(slots=True)
class ResponseBuilder:
    """The events of one response, from `start` (the in-progress response) to its end."""

    start: Response
    _items: list[OutputItem] = field(default_factory=list[OutputItem])
    _open: _OpenMessage | None = None
    _messages: int = 0  # messages opened so far: each gets its own id
    _sequence: int = 0

    def opening(self) -> list[Event]:
        return [
            self._event("response.created", response=self.start),
            self._event("response.in_progress", response=self.start),
        ]

    def reasoning(self, delta: str) -> list[Event]:
        """A thinking model's reasoning, in a reasoning item of its own."""
        return self._delta(delta, reasoning=True)

    def text(self, delta: str) -> list[Event]:
        return self._delta(delta, reasoning=False)

    def _delta(self, delta: str, *, reasoning: bool) -> list[Event]:
        if not delta:
            return []
        events = self._close_message() if self._open is not None and self._open.reasoning != reasoning else []
        message, opened = (self._open, []) if self._open is not None else self._open_message(reasoning)
        message.text += delta
        where = {"item_id": message.item_id, "output_index": message.index, "content_index": 0}
        if reasoning:
            events += [*opened, self._event("response.reasoning_text.delta", **where, delta=delta)]
        else:
            events += [*opened, self._event("response.output_text.delta", **where, delta=delta, logprobs=[])]
        return events

    def call(self, call: ToolCall) -> list[Event]:
        """One whole call: its item added, its arguments as one delta, then done."""
        events = self._close_message()
        index, item_id = len(self._items), f"fc_{call.id}"
        added = FunctionCallItem(id=item_id, call_id=call.id, name=call.name, arguments="", status="in_progress")
        done = msgspec.structs.replace(added, arguments=call.arguments, status="completed")
        self._items.append(done)
        where = {"item_id": item_id, "output_index": index}
        return [
            *events,
            self._event("response.output_item.added", output_index=index, item=added),
            self._event("response.function_call_arguments.delta", **where, delta=call.arguments),
            self._event("response.function_call_arguments.done", **where, arguments=call.arguments, name=call.name),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def finished(
        self, finish_reason: FinishReason, usage: Usage, reasoning_tokens: int = 0
    ) -> tuple[list[Event], Response]:
        """The events that end a task that completed (or was cancelled), and the final response;
        `reasoning_tokens`: how many of its tokens were reasoning (`reasoning_text`, re-tokenized)."""
        events = self._close_message()
        status = _STATUS_OF[finish_reason]
        final = msgspec.structs.replace(
            self.start,
            status=status,
            output=list(self._items),
            usage=response_usage(usage, reasoning_tokens),
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if finish_reason == "length" else None,
            shoal_finish_reason=finish_reason,
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(kind, response=final)], final

    @property
    def reasoning_text(self) -> str:
        """All the reasoning so far (one block: the splitter takes only the first)."""
        open_text = self._open.text if self._open is not None and self._open.reasoning else ""
        done = [part.text for item in self._items if isinstance(item, ReasoningItem) for part in item.content]
        return "".join(done) + open_text

    def failed(self, message: str, *, invalid_request: bool) -> list[Event]:
        """The event that ends a task that failed: its output so far, and why."""
        error = ResponseError(code="invalid_prompt" if invalid_request else "server_error", message=message)
        final = msgspec.structs.replace(self.start, status="failed", output=list(self._items), error=error)
        return [self._event("response.failed", response=final)]

    def _open_message(self, reasoning: bool) -> tuple[_OpenMessage, list[Event]]:
        self._messages += 1
        suffix = "" if self._messages == 1 else f"_{self._messages}"
        prefix = "rs" if reasoning else "msg"
        item_id = f"{prefix}_{self.start.id.removeprefix('resp_')}{suffix}"
        message = _OpenMessage(index=len(self._items), item_id=item_id, reasoning=reasoning)
        self._open = message
        item = _item(message, "in_progress", None)
        where = {"item_id": message.item_id, "output_index": message.index}
        self._items.append(item)  # replaced by its completed form when it closes
        return message, [
            self._event("response.output_item.added", output_index=message.index, item=item),
            self._event("response.content_part.added", **where, content_index=0, part=_part(message, "")),
        ]

    def _close_message(self) -> list[Event]:
        message = self._open
        if message is None:
            return []
        self._open = None
        part = _part(message, message.text)
        item = _item(message, "completed", part)
        self._items[message.index] = item
        where = {"item_id": message.item_id, "output_index": message.index, "content_index": 0}
        if message.reasoning:
            done = self._event("response.reasoning_text.done", **where, text=message.text)
        else:
            done = self._event("response.output_text.done", **where, text=message.text, logprobs=[])
        return [
            done,
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=message.index, item=item),
        ]

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event


def _part(message: _OpenMessage, text: str) -> OutputText | ReasoningText:
    if message.reasoning:
        return ReasoningText(type="reasoning_text", text=text)
    return OutputText(type="output_text", text=text, annotations=[], logprobs=[])


def _item(message: _OpenMessage, status: ItemStatus, part: OutputText | ReasoningText | None) -> OutputItem:
    """The item of an open text, without its part while in progress (as OpenAI adds it)."""
    if message.reasoning:
        parts = [part] if isinstance(part, ReasoningText) else []
        return ReasoningItem(id=message.item_id, status=status, summary=[], content=parts)
    texts = [part] if isinstance(part, OutputText) else []
    return OutputMessage(id=message.item_id, role="assistant", status=status, content=texts)


def event_sse(event: Event) -> bytes:
    """One event as the Responses API sends it: its type as the SSE `event`, itself as `data`."""
    data = msgspec.json.encode(event).decode()
    return f"event: {event['type']}\ndata: {data}\n\n".encode()
