"""The JSON bodies the API answers with, as msgspec structs: the routes encode these, and
`/openapi.json` describes its responses from the same types, so the document cannot drift from
what is sent (the schemathesis test holds them together)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec
from starlette.responses import Response

from events.vocabulary import FinishReason

OpenAIFinishReason = Literal["stop", "length", "tool_calls"]
ErrorKind = Literal["invalid_request_error", "server_error", "task_failed"]


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    type: ErrorKind
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorDetail


class CalledFunction(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    arguments: str  # JSON text


class ResponseToolCall(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["assistant"]
    content: str | None  # None when the turn is only tool calls
    tool_calls: list[ResponseToolCall] | None = None


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: OpenAIFinishReason


class ShoalUsage(msgspec.Struct, frozen=True, kw_only=True):
    ttft_ms: float
    prefill_tps: float
    decode_tps: float


class CompletionUsage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    shoal: ShoalUsage


class ChatCompletion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    shoal_finish_reason: FinishReason  # `cancelled` is `stop` to OpenAI clients; this says which


class ModelCard(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"]
    data: list[ModelCard]


class CancelAccepted(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    status: Literal["cancelling"]


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: Literal["ok", "starting", "no_workers"]
    last_seq: int
    nodes_up: int
    ready_instances: int
    log_caught_up: bool


def json_response(body: msgspec.Struct, *, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, headers=headers, media_type="application/json")
