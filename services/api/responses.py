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
    reasoning_content: str | None = None  # a thinking model's reasoning, apart from its answer


class TopLogprob(msgspec.Struct, frozen=True, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None  # the token's UTF-8 bytes (as the tokenizer decodes it alone)


class ChatTokenLogprob(msgspec.Struct, frozen=True, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct, frozen=True, kw_only=True):
    content: list[ChatTokenLogprob] | None


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: OpenAIFinishReason
    logprobs: ChoiceLogprobs | None = None


class ShoalUsage(msgspec.Struct, frozen=True, kw_only=True):
    ttft_ms: float
    prefill_tps: float
    decode_tps: float


class PromptTokensDetails(msgspec.Struct, frozen=True, kw_only=True):
    cached_tokens: int  # prompt tokens served from the prefix cache


class CompletionUsage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    shoal: ShoalUsage


class ChatCompletion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    shoal_finish_reason: FinishReason  # `cancelled` is `stop` to OpenAI clients; this says which


class ShardCard(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    rank: int
    start_layer: int  # inclusive
    end_layer: int  # exclusive
    memory_bytes: int = 0  # what placement reserved for the rank on its node


InstanceState = Literal["loading", "ready", "draining"]
# placed: an instance is ready; loading: one is on its way; draining: an operator unloaded it and
# it finishes its tasks; waiting: requests wait for an instance (for memory, or for a node);
# unloaded: let go (idle, evicted, an operator's unload), placed again by a request; cannot_fit and
# unavailable: `error` says why; not_loaded: never placed since the log began, placed on demand.
ModelState = Literal["placed", "loading", "draining", "waiting", "unloaded", "cannot_fit", "unavailable", "not_loaded"]


class InstanceCard(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    ready: bool
    shards: list[ShardCard]  # which node holds which layers, by rank
    state: InstanceState = "loading"
    placement: str = ""  # why these nodes (`shoal placement explain`)
    held: int = 0  # tasks assigned to it and not ended (in its batch, or handed ahead of it)


class ModelAction(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/admin/models/load|unload`'s answer: what was put on the log."""

    model: str
    action: Literal["load", "unload"]
    seq: int  # the request's place in the log


class DownloadCard(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    bytes_done: int
    bytes_total: int  # 0 = not known yet


class CompletionLogprobs(msgspec.Struct, frozen=True, kw_only=True):
    """The legacy completions' logprobs: parallel lists, one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]  # where each token starts in the choice's text (echoed prompt included)


class CompletionChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: OpenAIFinishReason


class TextCompletion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    shoal_finish_reason: FinishReason


class ModelCard(msgspec.Struct, frozen=True, kw_only=True):
    """OpenAI's model object (id, object, created, owned_by) and what a client of shoal also needs;
    the openai client keeps the extra fields (`model.context_length`, ...)."""

    id: str
    object: Literal["model"]
    created: int  # unix seconds the oldest live instance was placed; 0 when none is
    owned_by: str  # the Hub owner of a Hub id, else "shoal"
    context_length: int | None  # None until the API can read the model's config on its machine
    ready: bool
    instances: list[InstanceCard]
    downloads: list[DownloadCard]  # unfinished downloads, by node
    error: str | None  # why it is not served (neither cached nor downloadable, failed to load)
    state: ModelState = "not_loaded"
    pinned: bool = False  # an operator pinned it: never unloaded for idleness nor evicted


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"]
    data: list[ModelCard]


class CancelAccepted(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    status: Literal["cancelling"]


class Health(msgspec.Struct, frozen=True, kw_only=True):
    """`/healthz`: 200 unless `degraded` (then 503, so a load balancer takes this API out of
    rotation while it cannot reach the log: every request would be refused anyway)."""

    status: Literal["ok", "starting", "no_workers", "model_unavailable", "degraded"]
    last_seq: int
    nodes_up: int
    ready_instances: int
    log_caught_up: bool
    errors: dict[str, str] = msgspec.field(default_factory=dict)  # by model: why it is not served
    degraded: str = ""  # why the API cannot serve from the log now (its follow or connection is down)


class Liveness(msgspec.Struct, frozen=True, kw_only=True):
    """`/livez`: the process answers (always 200 while it does)."""

    status: Literal["ok"]


class Readiness(msgspec.Struct, frozen=True, kw_only=True):
    """`/readyz`: 200 when a model can be served, else 503 with the reason."""

    ready: bool
    status: Literal["ok", "starting", "no_workers", "model_unavailable", "degraded"]  # as `Health.status`
    reason: str  # "" when ready


def json_response(body: msgspec.Struct, *, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, headers=headers, media_type="application/json")
