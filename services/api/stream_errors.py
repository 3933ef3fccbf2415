"""How a streamed task's route tells its client of a refusal met while the task runs, in its API's
wire format: as the response, before the stream started, or as the stream's last event, after
(`task_stream.TaskStream` takes one; OpenAI's is the default, Anthropic's is in `anthropic_errors`)."""

from __future__ import annotations

from typing import Protocol

import msgspec
from starlette.responses import Response

from services.api.errors import error_body, error_for, internal_error_message
from services.api.openai_format import DONE, sse
from services.api.schemas import RequestProblem


class StreamErrors(Protocol):
    def response(self, problem: RequestProblem) -> Response: ...
    def last_event(self, problem: RequestProblem) -> bytes: ...


class OpenAIStreamErrors:
    """OpenAI's: the JSON error, or the stream's last chunk then [DONE]."""

    def response(self, problem: RequestProblem) -> Response:
        return error_for(problem)

    def last_event(self, problem: RequestProblem) -> bytes:
        return problem_chunk(problem)


def problem_chunk(problem: RequestProblem) -> bytes:
    """A refusal met after the stream started, as its last event, then [DONE]."""
    kind = "server_error" if problem.status >= 500 else "invalid_request_error"
    body = error_body(problem.message, kind=kind, param=problem.param, code=problem.code)
    return sse(msgspec.to_builtins(body)) + DONE


def internal_problem(exc: BaseException) -> RequestProblem:
    """A bug met after a stream started, told as the stream's last event (its kind only)."""
    return RequestProblem(500, internal_error_message(exc), code="internal_error")
