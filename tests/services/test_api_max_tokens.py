"""The API's `max_tokens`: a request default (DEFAULT_MAX_TOKENS) and a config limit, kept apart."""

from __future__ import annotations

import pytest

from events.task_params import DEFAULT_MAX_TOKENS, TaskParams
from services.api.schemas import ChatCompletionRequest, RequestMessage, RequestProblem, to_task
from services.config import ShoalConfig

LIMIT = ShoalConfig().max_tokens_limit


def _request(max_tokens: int | None = None, max_completion_tokens: int | None = None) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="tiny",
        messages=[RequestMessage(role="user", content="hi")],
        max_tokens=max_tokens,
        max_completion_tokens=max_completion_tokens,
    )


def test_a_request_that_does_not_say_gets_the_default_the_task_would_have() -> None:
    _, params = to_task(_request(), max_tokens_limit=LIMIT)
    assert params.max_tokens == DEFAULT_MAX_TOKENS == TaskParams().max_tokens


def test_a_limit_below_the_default_caps_it_instead_of_refusing_a_request_that_asked_for_nothing() -> None:
    _, params = to_task(_request(), max_tokens_limit=DEFAULT_MAX_TOKENS // 2)
    assert params.max_tokens == DEFAULT_MAX_TOKENS // 2


def test_a_request_over_the_limit_is_refused_and_one_within_it_kept() -> None:
    with pytest.raises(RequestProblem, match=f"exceeds this server's limit of {LIMIT}"):
        to_task(_request(max_tokens=LIMIT + 1), max_tokens_limit=LIMIT)
    _, params = to_task(_request(max_completion_tokens=LIMIT), max_tokens_limit=LIMIT)
    assert params.max_tokens == LIMIT
