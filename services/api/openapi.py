"""The OpenAPI document of the API, with request schemas generated from the msgspec structs."""

from __future__ import annotations

from typing import Any

import msgspec

from services.api.schemas import ChatCompletionRequest


def openapi_document() -> dict[str, Any]:
    (request_ref,), components = msgspec.json.schema_components(
        [ChatCompletionRequest], ref_template="#/components/schemas/{name}"
    )
    error = {"description": "error", "content": {"application/json": {"schema": {"type": "object"}}}}
    json_ok = {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}

    def op(summary: str, **extra: Any) -> dict[str, Any]:
        return {"summary": summary, "responses": {"200": json_ok, "400": error, "404": error}, **extra}

    task_param = [{"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "shoal", "version": "0.1.0", "description": "OpenAI-compatible API of a shoal cluster"},
        "paths": {
            "/v1/chat/completions": {
                "post": {
                    "summary": "Create a chat completion (streaming with stream=true; header x-shoal-task-id)",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": request_ref}}},
                    "responses": {
                        "200": {"description": "completion (JSON or text/event-stream)"},
                        "400": error,
                        "404": error,
                        "413": error,
                        "503": error,
                    },
                }
            },
            "/v1/models": {"get": op("List models")},
            "/v1/tasks/{task_id}": {"get": op("A task's state folded from the log", parameters=task_param)},
            "/v1/tasks/{task_id}/cancel": {
                "post": {
                    "summary": "Cancel a task",
                    "parameters": task_param,
                    "responses": {"202": json_ok, "404": error, "409": error},
                }
            },
            "/v1/config": {"get": op("Effective configuration with the source of each value")},
            "/healthz": {"get": op("Health")},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}},
            "/debug/timeline": {
                "get": {"summary": "Waterfall of a task (HTML)", "responses": {"200": {"description": "html"}}}
            },
        },
        "components": {"schemas": components},
    }
