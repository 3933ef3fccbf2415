"""Every error the API answers, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

One place makes them, so a client's error path never meets a bare `Internal Server Error`, a
plain-text 404 or a reset connection: a refused request (`RequestProblem`), a write the log refuses
(`LogError`, 503: the cluster cannot take work now, and why), an unknown route or method
(Starlette's `HTTPException`), and, last, a bug (500; the server still logs its traceback).
Routes raise; `error_for` answers. The authentication checks' 401/403 go through it too.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from eventlog.publish import LogError
from events.catalogue import TaskFailed
from services.api.responses import ErrorDetail, ErrorKind, ErrorResponse, json_response
from services.api.schemas import RequestProblem

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_body(message: str, *, kind: ErrorKind, param: str | None = None, code: str | None = None) -> ErrorResponse:
    return ErrorResponse(error=ErrorDetail(message=message, type=kind, param=param, code=code))


def error_response(
    status: int,
    message: str,
    *,
    kind: ErrorKind | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An error response; its `type` is OpenAI's for a client's mistake (4xx) or the server's (5xx)
    unless `kind` says otherwise."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return json_response(error_body(message, kind=kind, param=param, code=code), status=status, headers=headers)


def log_refused(exc: LogError) -> RequestProblem:
    """A write JetStream would not take (storage full, a stream limit, no quorum): the cluster is
    up but cannot accept the request now; a client may retry later."""
    return RequestProblem(503, f"the event log refused the write, so nothing was taken: {exc}", code="log_unavailable")


def error_for(exc: Exception) -> Response:
    match exc:
        case RequestProblem():
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers)
        case LogError():
            return error_for(log_refused(exc))
        case HTTPException():
            return error_response(
                exc.status_code, exc.detail, code=_HTTP_CODES.get(exc.status_code), headers=exc.headers
            )
        case _:
            return error_response(500, internal_error_message(exc), code="internal_error")


def internal_error_message(exc: BaseException) -> str:
    """What a client is told of a bug: its kind only; the traceback goes to the server's log."""
    return f"internal error ({type(exc).__name__}); the server's log has the details"


async def _handle(request: Request, exc: Exception) -> Response:
    return error_for(exc)


# For Starlette(exception_handlers=...): `Exception` is answered by its outermost middleware,
# which sends this response and re-raises so that the server logs the bug.
EXCEPTION_HANDLERS = {RequestProblem: _handle, LogError: _handle, HTTPException: _handle, Exception: _handle}


def failure_status(event: TaskFailed) -> tuple[int, ErrorKind, str]:
    """A failed task's HTTP status, error type and code: 504 past its deadline, 400 for a request
    the runners refused (its size against the KV, a grammar, ...: not worth a retry), else 500."""
    if event.deadline:
        return 504, "task_failed", "request_timeout"
    if event.invalid_request:
        return 400, "invalid_request_error", "invalid_request"
    return 500, "task_failed", "task_failed"
