"""Every error of the Anthropic routes (`/v1/messages...`) in Anthropic's shape:
`{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}`, the `type` chosen
by status (`messages_format.error_kind`). The problems are the ones every route raises
(`RequestProblem`, `LogError`, Starlette's `HTTPException`, a bug); only their shape differs from
`errors.error_for`'s, so the Anthropic SDK raises its own exception classes for them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from eventlog.publish import LogError
from services.api.errors import internal_error_message, log_refused
from services.api.messages_format import anthropic_error, error_event
from services.api.schemas import RequestProblem

ANTHROPIC_PATHS = "/v1/messages"  # the prefix of every route answered in Anthropic's shape

ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


def anthropic_error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    body = msgspec.json.encode(anthropic_error(status, message))
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def anthropic_error_for(exc: Exception) -> Response:
    match exc:
        case RequestProblem():
            return anthropic_error_response(exc.status, problem_message(exc), exc.headers)
        case LogError():
            return anthropic_error_for(log_refused(exc))
        case HTTPException():
            return anthropic_error_response(exc.status_code, exc.detail, exc.headers)
        case _:
            return anthropic_error_response(500, internal_error_message(exc))


def problem_message(problem: RequestProblem) -> str:
    """Anthropic's error has no `param`: the field to fix leads the message instead."""
    if problem.param is None or problem.message.startswith(problem.param):
        return problem.message
    return f"{problem.param}: {problem.message}"


class AnthropicStreamErrors:
    """For `TaskStream`: a refusal as the JSON error before the stream started, else as its
    `error` event (after which Anthropic's streams end)."""

    def response(self, problem: RequestProblem) -> Response:
        return anthropic_error_for(problem)

    def last_event(self, problem: RequestProblem) -> bytes:
        return error_event(problem.status, problem_message(problem))


def with_anthropic_errors(
    handlers: Mapping[type[Exception], ExceptionHandler],
) -> dict[type[Exception], ExceptionHandler]:
    """Starlette's exception handlers, answering under `ANTHROPIC_PATHS` in Anthropic's shape (an
    unknown method or sub-route there, a bug) and elsewhere as `handlers` do."""

    def choose(handler: ExceptionHandler) -> ExceptionHandler:
        async def handle(request: Request, exc: Exception) -> Response:
            if request.url.path.startswith(ANTHROPIC_PATHS):
                return anthropic_error_for(exc)
            return await handler(request, exc)

        return handle

    return {kind: choose(handler) for kind, handler in handlers.items()}
