"""The OpenAPI document of the API. Request and response schemas are generated from the msgspec
structs the routes decode and encode (`schemas.py`, `responses.py`, the State's `TaskInfo`), so
the document says what is sent; every error is an `ErrorResponse` in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import msgspec

from events.state import TaskInfo
from services.api.messages_format import AnthropicError, Message, TokenCount
from services.api.messages_schemas import CountTokensRequest, MessagesRequest
from services.api.responses import (
    CancelAccepted,
    ChatCompletion,
    ErrorResponse,
    Health,
    Liveness,
    ModelAction,
    ModelCard,
    ModelList,
    Readiness,
    TextCompletion,
)
from services.api.responses_api_format import Response
from services.api.responses_api_schemas import ResponsesRequest
from services.api.routes import LoadModel, UnloadModel
from services.api.schemas import ChatCompletionRequest, CompletionRequest

_TYPES = (
    ChatCompletionRequest,
    ChatCompletion,
    ErrorResponse,
    ModelList,
    ModelCard,
    TaskInfo,
    CancelAccepted,
    Health,
    CompletionRequest,
    TextCompletion,
    LoadModel,
    UnloadModel,
    ModelAction,
    ResponsesRequest,
    Response,
    MessagesRequest,
    Message,
    CountTokensRequest,
    TokenCount,
    AnthropicError,
    Liveness,
    Readiness,
)


def openapi_document() -> dict[str, Any]:
    refs, components = msgspec.json.schema_components(_TYPES, ref_template="#/components/schemas/{name}")
    (
        request,
        chat_completion,
        error_schema,
        model_list,
        model_card,
        task,
        cancel,
        health,
        text_request,
        text_completion,
        load_request,
        unload_request,
        model_action,
        responses_request,
        response,
        *anthropic_refs,
        liveness,
        readiness,
    ) = refs

    def json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    def text(description: str, media_type: str) -> dict[str, Any]:
        return {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}

    def errors(*statuses: int) -> dict[str, Any]:
        return {str(status): json("error", error_schema) for status in statuses}

    def streamed(schema: dict[str, Any], chunk: str) -> dict[str, Any]:
        answer = json(f"completion (with stream=true: text/event-stream of {chunk}); header x-shoal-task-id", schema)
        # each server-sent event's `data` is a JSON chunk, then the literal [DONE]; `: keepalive`
        # comment lines come whenever the stream was silent for sse_keepalive_seconds
        event = {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
        answer["content"]["text/event-stream"] = {"schema": event}
        return answer

    task_param = [{"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "shoal", "version": "0.1.0", "description": "OpenAI-compatible API of a shoal cluster"},
        "paths": {
            "/v1/chat/completions": {
                "post": {
                    "summary": "Create a chat completion",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
                    # 408: the body did not arrive in time; 500: the task failed on its runner (type task_failed); 503: no worker, or the log is full
                    "responses": {
                        "200": streamed(chat_completion, "chat.completion.chunk"),
                        **errors(400, 404, 408, 413, 500, 503),
                    },
                }
            },
            "/v1/completions": {
                "post": {
                    "summary": "Create a text completion (one prompt: text or token ids, no chat template)",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": text_request}}},
                    "responses": {
                        "200": streamed(text_completion, "text_completion"),
                        **errors(400, 404, 408, 413, 500, 503),
                    },
                }
            },
            "/v1/responses": {
                "post": {
                    "summary": "Create a model response (OpenAI's Responses API; no state is kept: store is false)",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": responses_request}}},
                    "responses": {
                        "200": streamed(response, "Responses events (response.created, ...)"),
                        **errors(400, 404, 408, 413, 500, 503),
                    },
                }
            },
            **_anthropic_paths(*anthropic_refs),
            "/v1/models": {"get": {"summary": "List models", "responses": {"200": json("models", model_list)}}},
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model (its id may hold a slash: owner/name)",
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {"200": json("model", model_card), **errors(404)},
                }
            },
            "/v1/tasks/{task_id}": {
                "get": {
                    "summary": "A task's state folded from the log",
                    "parameters": task_param,
                    "responses": {"200": json("the task", task), **errors(400, 404)},
                }
            },
            "/v1/tasks/{task_id}/cancel": {
                "post": {
                    "summary": "Cancel a task",
                    "parameters": task_param,
                    "responses": {"202": json("cancelling", cancel), **errors(400, 404, 409, 503)},
                }
            },
            "/v1/admin/models/load": {
                "post": {
                    "summary": "Place a model now, optionally pinned and on given nodes (an admin key)",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": load_request}}},
                    "responses": {
                        "202": json("the load request is on the log", model_action),
                        **errors(400, 401, 403, 404, 503),
                    },
                }
            },
            "/v1/admin/models/unload": {
                "post": {
                    "summary": "Retire a model's instances once their running tasks end (an admin key)",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": unload_request}}},
                    "responses": {
                        "202": json("the unload request is on the log", model_action),
                        **errors(400, 404, 503),
                    },
                }
            },
            "/v1/config": {
                "get": {
                    "summary": "Effective configuration with the source of each value",
                    "responses": {"200": json("config", {"type": "object"})},
                }
            },
            "/healthz": {"get": {"summary": "Health", "responses": {"200": json("health", health)}}},
            "/livez": {
                "get": {"summary": "Liveness: the process answers", "responses": {"200": json("alive", liveness)}}
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: a model can be served (503 with the reason otherwise)",
                    "responses": {"200": json("ready", readiness), "503": json("not ready, and why", readiness)},
                }
            },
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": text("metrics", "text/plain")}}},
            "/debug/timeline": {
                "get": {
                    "summary": "Waterfall of a task",
                    "parameters": [{"name": "task", "in": "query", "required": True, "schema": {"type": "string"}}],
                    "responses": {"200": text("html", "text/html"), **errors(400, 404)},
                }
            },
        },
        "components": {"schemas": components},
    }


def _anthropic_paths(
    request: dict[str, Any],
    message: dict[str, Any],
    count_request: dict[str, Any],
    token_count: dict[str, Any],
    error_schema: dict[str, Any],
) -> dict[str, Any]:
    """Anthropic's Messages routes: their errors in Anthropic's shape (`AnthropicError`)."""

    def json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    def errors(*statuses: int) -> dict[str, Any]:
        return {str(status): json("error (Anthropic's shape)", error_schema) for status in statuses}

    streamed = json("message (with stream=true: text/event-stream of Anthropic's message events)", message)
    # each server-sent event has an `event:` name and a JSON `data`; `: keepalive` comments come whenever it was silent
    event = {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
    streamed["content"]["text/event-stream"] = {"schema": event}
    # 401: no or a wrong key (x-api-key or Authorization: Bearer); 408: the body came too slowly;
    # 429: the queue is full; 500: the task failed on its runner; 503: no worker, the log is full, or stopping
    return {
        "/v1/messages": {
            "post": {
                "summary": "Create a message (Anthropic's Messages API)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
                "responses": {"200": streamed, **errors(400, 401, 404, 408, 413, 429, 500, 503)},
            }
        },
        "/v1/messages/count_tokens": {
            "post": {
                "summary": "Count a message's prompt tokens in the model's chat template",
                "requestBody": {"required": True, "content": {"application/json": {"schema": count_request}}},
                "responses": {"200": json("token count", token_count), **errors(400, 401, 404, 408, 413, 429, 503)},
            }
        },
    }
