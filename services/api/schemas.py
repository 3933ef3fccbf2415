"""Request bodies of the HTTP API, decoded strictly with msgspec at the edge.

A decoding error names the field (`$.messages[0].role`), which is what the 400 response says.
Limits from the config are checked after decoding: max_tokens in `to_task`, the prompt's size by
the chat handler (it needs the model's tokenizer).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from events.catalogue import ChatMessage, TaskParams


class TextPart(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["text"]
    text: str


class RequestMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    include_usage: bool = False
    include_progress: bool = False


class ChatCompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    messages: list[RequestMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    shoal_progress: bool = False
    n: int = 1
    user: str | None = None

    @property
    def wants_progress(self) -> bool:
        return self.shoal_progress or (self.stream_options is not None and self.stream_options.include_progress)

    @property
    def wants_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class RequestProblem(Exception):
    """A request the API refuses: HTTP status plus a message saying what to fix."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


_decoder = msgspec.json.Decoder(ChatCompletionRequest)


def decode_chat_request(body: bytes) -> ChatCompletionRequest:
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as exc:
        field = str(exc).rpartition(" - at ")[2] if " - at " in str(exc) else None
        raise RequestProblem(400, f"invalid request body: {exc}", param=field) from exc
    except msgspec.DecodeError as exc:
        raise RequestProblem(400, f"request body is not valid JSON: {exc}") from exc


def to_task(
    request: ChatCompletionRequest, *, max_tokens_limit: int, default_max_tokens: int
) -> tuple[list[ChatMessage], TaskParams]:
    """Messages and params for `TaskCreated`, after checking the values a model cannot fix."""
    if not request.messages:
        raise RequestProblem(400, "messages must hold at least one message", param="messages")
    if request.n != 1:
        raise RequestProblem(400, "only n=1 is supported", param="n")
    max_tokens = request.max_completion_tokens or request.max_tokens or default_max_tokens
    if max_tokens <= 0:
        raise RequestProblem(400, f"max_tokens must be > 0, got {max_tokens}", param="max_tokens")
    if max_tokens > max_tokens_limit:
        raise RequestProblem(
            400, f"max_tokens={max_tokens} exceeds this server's limit of {max_tokens_limit}", param="max_tokens"
        )
    if not 0.0 <= request.temperature <= 2.0:
        raise RequestProblem(400, f"temperature must be within [0, 2], got {request.temperature}", param="temperature")
    if not 0.0 < request.top_p <= 1.0:
        raise RequestProblem(400, f"top_p must be within (0, 1], got {request.top_p}", param="top_p")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stop) > 4 or any(not s for s in stop):
        raise RequestProblem(400, "stop takes up to 4 non-empty strings", param="stop")
    messages = [ChatMessage(role=m.role, content=m.text()) for m in request.messages]
    params = TaskParams(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=stop,
        stream_progress=request.wants_progress,
    )
    return messages, params
