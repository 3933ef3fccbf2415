"""`/v1/completions` and logprobs requests decoded and checked at the edge, and the legacy
logprobs shape (pure: no cluster)."""

from __future__ import annotations

import json

import pytest

from events.logprobs import TokenLogprob, TopLogprob
from services.api.completions_format import completion_logprobs
from services.api.schemas import (
    RequestProblem,
    completion_params,
    decode_chat_request,
    decode_completion_request,
    to_task,
)

LIMIT = 4096


def _completion(**fields: object) -> bytes:
    return json.dumps({"model": "tiny", "prompt": "hi", **fields}).encode()


def _chat(**fields: object) -> bytes:
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("text", "text"), ([1, 2, 3], [1, 2, 3]), (["text"], "text"), ([[4, 5]], [4, 5])],
)
def test_one_prompt_as_text_or_token_ids(prompt: object, expected: object) -> None:
    assert decode_completion_request(_completion(prompt=prompt)).single_prompt() == expected


@pytest.mark.parametrize("prompt", [["a", "b"], [[1], [2]], [1, "a"]])
def test_several_prompts_are_refused_naming_prompt(prompt: object) -> None:
    with pytest.raises(RequestProblem, match="one prompt per request") as caught:
        decode_completion_request(_completion(prompt=prompt)).single_prompt()
    assert caught.value.param == "prompt"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [-1]}, "prompt[0]"),
        ({"logprobs": 6}, "logprobs"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "x"}, "suffix"),
    ],
)
def test_bad_completion_fields_are_named(fields: dict[str, object], param: str) -> None:
    with pytest.raises(RequestProblem) as caught:
        decode_completion_request(_completion(**fields))
    assert caught.value.status == 400 and caught.value.param == param


def test_completion_params_carry_logprobs_and_refuse_echo_with_them() -> None:
    params = completion_params(decode_completion_request(_completion(logprobs=0, stop="x")), max_tokens_limit=LIMIT)
    assert params.logprobs == 0 and params.stop == ["x"]
    assert completion_params(decode_completion_request(_completion()), max_tokens_limit=LIMIT).logprobs is None
    with pytest.raises(RequestProblem) as caught:
        completion_params(decode_completion_request(_completion(echo=True, logprobs=2)), max_tokens_limit=LIMIT)
    assert caught.value.param == "echo"


@pytest.mark.parametrize(
    ("fields", "logprobs"),
    [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 20}, 20)],
)
def test_chat_logprobs_become_the_tasks(fields: dict[str, object], logprobs: int | None) -> None:
    _, params = to_task(decode_chat_request(_chat(**fields)), max_tokens_limit=LIMIT)
    assert params.logprobs == logprobs


def test_chat_top_logprobs_needs_logprobs_and_a_bound() -> None:
    with pytest.raises(RequestProblem, match="needs logprobs=true"):
        to_task(decode_chat_request(_chat(top_logprobs=2)), max_tokens_limit=LIMIT)
    with pytest.raises(RequestProblem) as caught:
        decode_chat_request(_chat(logprobs=True, top_logprobs=21))
    assert caught.value.param == "top_logprobs"


def test_legacy_logprobs_offsets_start_after_the_echo() -> None:
    tokens = [
        TokenLogprob(token_id=1, token="ab", logprob=-0.5, top=[TopLogprob(token_id=1, token="ab", logprob=-0.5)]),
        TokenLogprob(token_id=2, token="c", logprob=-1.0),
    ]
    shaped = completion_logprobs(tokens, offset=3)
    assert shaped.tokens == ["ab", "c"]
    assert shaped.token_logprobs == [-0.5, -1.0]
    assert shaped.top_logprobs == [{"ab": -0.5}, {}]
    assert shaped.text_offset == [3, 5]
