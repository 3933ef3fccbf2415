"""What the chat route refuses before anything is published: each odd body is a 400 naming the
field, decided by `decode_chat_request` and `to_task` alone (the live cluster's side of the same
inputs is tests/e2e/test_hostile_input.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.api.schemas import (
    MAX_STOP_BYTES,
    SEED_MAX,
    UNSUPPORTED_PARAMS,
    ChatCompletionRequest,
    RequestProblem,
    completion_params,
    decode_chat_request,
    decode_completion_request,
    keep_alive_seconds,
    to_task,
)

LIMIT = 4096


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


def refused(raw: bytes) -> RequestProblem:
    with pytest.raises(RequestProblem) as caught:
        to_task(decode_chat_request(raw), max_tokens_limit=LIMIT)
    assert caught.value.status == 400
    return caught.value


def accepted(raw: bytes) -> ChatCompletionRequest:
    request = decode_chat_request(raw)
    to_task(request, max_tokens_limit=LIMIT)
    return request


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_zero_or_negative_max_tokens_is_refused_not_replaced_by_the_default(field: str) -> None:
    for value in (0, -1):
        assert refused(body(**{field: value})).param == field


@pytest.mark.parametrize("seed", [-1, SEED_MAX + 1, 2**64])
def test_a_seed_out_of_range_is_refused(seed: int) -> None:
    assert refused(body(seed=seed)).param == "seed"


def test_the_seeds_at_the_ends_of_the_range_are_taken() -> None:
    assert [accepted(body(seed=seed)).seed for seed in (0, SEED_MAX)] == [0, SEED_MAX]


@pytest.mark.parametrize(
    "stop",
    [
        ["a", "b", "c", "d", "e"],  # too many
        [""],  # would stop at once
        "",
        ["x" * (MAX_STOP_BYTES // 2), "y" * (MAX_STOP_BYTES // 2 + 1)],  # too many bytes together
        ["é" * (MAX_STOP_BYTES // 2 + 1)],  # bytes, not characters
    ],
)
def test_stop_strings_are_bounded_in_count_and_bytes(stop: object) -> None:
    assert (refused(body(stop=stop)).param or "").startswith("stop")


def test_stop_strings_within_the_bounds_are_taken() -> None:
    _, params = to_task(decode_chat_request(body(stop=["a", "b", "c", "x" * 500])), max_tokens_limit=LIMIT)
    assert params.stop == ["a", "b", "c", "x" * 500]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 2.5),
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("temperature", 1e400),
        ("min_p", -0.1),
        ("min_p", 1.5),
        ("top_k", -1),
        ("top_k", 2**40),
        ("top_k", 2.5),
    ],
)
def test_sampling_values_out_of_range_are_refused(field: str, value: float) -> None:
    assert refused(body(**{field: value}).replace(b"Infinity", b"1e400")).param == field


@pytest.mark.parametrize("raw", [b"", b"model=tiny&messages=hi", b"[]", b"null", b'{"model": "tiny"', b"\xff\xfe"])
def test_a_body_that_is_not_a_json_object_is_refused(raw: bytes) -> None:
    refused(raw)


def _with_content(escaped: str) -> bytes:
    """A chat body whose message content is `escaped`, written into the JSON as it stands."""
    return b'{"model": "tiny", "messages": [{"role": "user", "content": "' + escaped.encode() + b'"}]}'


def _with_prompt(escaped: str) -> bytes:
    return b'{"model": "tiny", "prompt": "' + escaped.encode() + b'"}'


@pytest.mark.parametrize(
    ("escaped", "lone"),
    [
        ("\\ud83d", "\\ud83d"),
        ("cut \\ud83d", "\\ud83d"),
        ("\\ude00 tail", "\\ude00"),
        ("\\ude00\\ud83d", "\\ude00"),
        ("\\\\\\ud800", "\\ud800"),
    ],
)
@pytest.mark.parametrize(
    ("decode", "write"), [(decode_chat_request, _with_content), (decode_completion_request, _with_prompt)]
)
def test_half_a_surrogate_pair_is_refused_saying_where_and_what_to_send(
    escaped: str, lone: str, decode: Any, write: Any
) -> None:
    """Valid JSON syntax, but no character (a string cut by UTF-16 units); msgspec alone calls it
    truncated input."""
    raw = write(escaped)
    with pytest.raises(RequestProblem) as caught:
        decode(raw)
    message = str(caught.value)
    assert caught.value.status == 400 and "truncated" not in message
    assert f"{lone} at byte {raw.index(lone.encode())} is half of a UTF-16 surrogate pair" in message, message
    assert "send whole characters" in message


def test_a_whole_surrogate_pair_and_an_escaped_backslash_before_u_are_taken() -> None:
    assert accepted(_with_content("\\ud83d\\ude00!")).messages[0].content == "\U0001f600!"
    assert accepted(_with_content("\\\\ud800")).messages[0].content == "\\ud800"  # a backslash, then text


def test_an_image_part_is_refused_saying_shoal_serves_text() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    problem = refused(body(messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]))
    assert problem.param == "messages[0].content[1].type"
    assert "shoal serves text models" in str(problem) and "image" in str(problem)


def test_an_empty_message_list_is_refused() -> None:
    assert refused(body(messages=[])).param == "messages"


def test_a_deeply_nested_unknown_field_is_refused_not_a_crash() -> None:
    deep = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "extra": ' + b"[" * 100_000
    refused(deep + b"]" * 100_000 + b"}")


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_PARAMS))
def test_an_openai_parameter_shoal_does_not_implement_is_refused_by_name(name: str) -> None:
    problem = refused(body(**{name: {"something": "shoal cannot do"}}))
    assert problem.param == name and problem.code == "unsupported_parameter" and f"`{name}`" in problem.message


@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, values in UNSUPPORTED_PARAMS.items() for v in (None, *values)]
)
def test_the_value_that_asks_for_nothing_more_is_taken(name: str, value: object) -> None:
    """Clients that send OpenAI's defaults (`n: 1`, `logprobs: false`, `tools: []`) keep working."""
    accepted(body(**{name: value}))


def test_n_reaches_the_task_within_openais_bound() -> None:
    assert to_task(decode_chat_request(body(n=3)), max_tokens_limit=LIMIT)[1].n == 3
    assert to_task(decode_chat_request(body()), max_tokens_limit=LIMIT)[1].n == 1
    for bad in (0, -1, 129, True, 1.5, "2"):  # JSON true is not 1; the server's own bound is `max_choices`
        assert refused(body(n=bad)).param == "n", bad


def test_n_with_a_grammar_is_refused_naming_n() -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    with pytest.raises(RequestProblem) as caught:
        to_task(decode_chat_request(body(n=2, response_format=schema)), max_tokens_limit=LIMIT)
    assert caught.value.status == 400 and caught.value.param == "n"
    assert "grammar" in caught.value.message


def test_penalties_and_logit_bias_reach_the_task() -> None:
    request = decode_chat_request(
        body(frequency_penalty=0.5, presence_penalty=-2, logit_bias={"42": 100, "7": -1.5, "0": 0})
    )
    _messages, params = to_task(request, max_tokens_limit=LIMIT)
    assert (params.frequency_penalty, params.presence_penalty) == (0.5, -2.0)
    assert params.logit_bias == [(42, 100.0), (7, -1.5), (0, 0.0)]
    _messages, params = to_task(decode_chat_request(body()), max_tokens_limit=LIMIT)
    assert (params.frequency_penalty, params.presence_penalty, params.logit_bias) == (0.0, 0.0, [])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"frequency_penalty": 2.01}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"presence_penalty": "high"}, "presence_penalty"),
        ({"logit_bias": {"42": 101}}, "logit_bias"),
        ({"logit_bias": {"42": "up"}}, "logit_bias"),
        ({"logit_bias": {"the": 1}}, "logit_bias"),  # a word, not a token id
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"1e3": 1}}, "logit_bias"),
        ({"logit_bias": {"\u0661": 1}}, "logit_bias"),  # a digit, but not an ASCII one
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"logit_bias": [[42, 1]]}, "logit_bias"),
    ],
)
def test_penalties_and_logit_bias_out_of_range_are_refused_naming_them(fields: dict[str, Any], param: str) -> None:
    problem = refused(body(**fields))
    assert problem.param is not None and problem.param.startswith(param), problem.message


NULLABLE = [
    "temperature",
    "top_p",
    "stream",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "seed",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "user",
    "tools",
    "tool_choice",
    "response_format",
    "stream_options",
    "n",
]


@pytest.mark.parametrize("name", NULLABLE)
def test_null_for_a_nullable_openai_parameter_means_left_out(name: str) -> None:
    """OpenAI's schema makes these `... or null`; clients that serialize every field send null."""
    left_out = to_task(decode_chat_request(body()), max_tokens_limit=LIMIT)
    assert to_task(decode_chat_request(body(**{name: None})), max_tokens_limit=LIMIT) == left_out
    assert decode_chat_request(body(**{name: None})).stream in (None, False)


@pytest.mark.parametrize("name", ["temperature", "top_p", "stream", "frequency_penalty", "presence_penalty", "echo"])
def test_null_is_left_out_for_completions_too(name: str) -> None:
    raw = json.dumps({"model": "tiny", "prompt": "hi", name: None}).encode()
    left_out = json.dumps({"model": "tiny", "prompt": "hi"}).encode()
    params = completion_params(decode_completion_request(raw), max_tokens_limit=LIMIT)
    assert params == completion_params(decode_completion_request(left_out), max_tokens_limit=LIMIT)


def test_top_k_and_min_p_reach_the_task_and_null_leaves_them_off() -> None:
    _, params = to_task(decode_chat_request(body(top_k=40, min_p=0.05)), max_tokens_limit=LIMIT)
    assert (params.top_k, params.min_p) == (40, 0.05)
    _, params = to_task(decode_chat_request(body(top_k=None, min_p=None)), max_tokens_limit=LIMIT)
    assert (params.top_k, params.min_p) == (0, 0.0)
    params = completion_params(
        decode_completion_request(json.dumps({"model": "tiny", "prompt": "hi", "top_k": 3, "min_p": 1}).encode()),
        max_tokens_limit=LIMIT,
    )
    assert (params.top_k, params.min_p) == (3, 1.0)


@pytest.mark.parametrize("name", ["repetition_penalty", "min_tokens", "ignore_eos", "typical_p"])
def test_another_servers_sampling_extension_is_refused_by_name_not_ignored(name: str) -> None:
    problem = refused(body(**{name: 7}))
    assert problem.param == name and f"`{name}`" in problem.message
    with pytest.raises(RequestProblem):
        decode_completion_request(json.dumps({"model": "tiny", "prompt": "hi", name: 7}).encode())


@pytest.mark.parametrize("role", ["user", "system", "tool", "assistant"])
def test_a_message_without_content_is_refused_unless_an_assistant_calls_tools(role: str) -> None:
    for message in ({"role": role, "content": None}, {"role": role}):
        problem = refused(body(messages=[{"role": "user", "content": "hi"}, message]))
        assert problem.param == "messages[1].content" and "no content" in problem.message
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    accepted(
        body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}])
    )


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (None, None),
        (0, 0.0),
        (30, 30.0),
        (-1, -1.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("-1", -1.0),
        ("90", 90.0),
        ("250ms", 0.25),
        ("2.5s", 2.5),
    ],
)
def test_keep_alive_takes_seconds_or_a_duration_as_ollama_does(
    given: float | str | None, seconds: float | None
) -> None:
    assert keep_alive_seconds(given) == seconds


@pytest.mark.parametrize("given", ["5 minutes", "m5", "1h30", "5x"])
def test_a_keep_alive_that_is_no_duration_says_what_to_give(given: str) -> None:
    with pytest.raises(RequestProblem, match="not a duration"):
        keep_alive_seconds(given)
