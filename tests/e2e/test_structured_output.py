"""Structured output and tool calls through the official openai client, on 1 and 2 workers: the
tiny random model writes noise on its own, so every valid answer here is the grammar's doing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.helpers import serve_cluster

pytestmark = pytest.mark.timeout(300)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
WEATHER: Any = {  # Any: the openai client's TypedDicts would want every literal spelled out
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK: Any = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NOPE: Any = {"type": "function", "function": {"name": "nope"}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=[1, 2], ids=["1w", "2w"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from serve_cluster(tmp_path_factory.mktemp("cluster"), workers=request.param)


def _ask(client: openai.OpenAI, stream: bool, **extra: Any) -> tuple[str, str | None]:
    """(content, finish_reason), streamed or not."""
    if not stream:
        choice = client.chat.completions.create(model="tiny", messages=ASK, **extra).choices[0]
        return choice.message.content or "", choice.finish_reason
    parts: list[str] = []
    finish: str | None = None
    for chunk in client.chat.completions.create(model="tiny", messages=ASK, stream=True, **extra):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_json_object_is_an_object(cluster: Cluster, stream: bool) -> None:
    text, finish = _ask(cluster.client(), stream, max_tokens=200, response_format={"type": "json_object"})
    assert finish == "stop", text
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_json_schema_answer_validates(cluster: Cluster, stream: bool) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    text, finish = _ask(cluster.client(), stream, max_tokens=200, response_format=response_format)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), PERSON)


def test_a_cut_answer_says_length(cluster: Cluster) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    text, finish = _ask(cluster.client(), False, max_tokens=3, response_format=response_format)
    assert finish == "length"
    assert text.startswith("{")


def test_tool_call_round_trip(cluster: Cluster) -> None:
    client = cluster.client()
    first = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        max_tokens=200,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name in ("get_weather", "get_time")
    schema = WEATHER if call.function.name == "get_weather" else CLOCK
    jsonschema.validate(json.loads(call.function.arguments), schema["function"]["parameters"])
    follow_up = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "clear", "celsius": 21})},
    ]
    answer = client.chat.completions.create(model="tiny", messages=follow_up, tools=[WEATHER, CLOCK], max_tokens=8)
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert not answer.choices[0].message.tool_calls


def test_named_tool_call_streams_deltas_the_client_assembles(cluster: Cluster) -> None:
    choice: Any = {"type": "function", "function": {"name": "get_weather"}}
    with cluster.client().chat.completions.stream(
        model="tiny",
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice=choice,
        max_tokens=200,
    ) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls and message.tool_calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), WEATHER["function"]["parameters"])


def test_tools_with_auto_leave_a_plain_answer_as_content(cluster: Cluster) -> None:
    choice = (
        cluster.client().chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=8).choices[0]
    )
    assert choice.message.content and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")


def test_bad_schema_and_unknown_tool_are_400(cluster: Cluster) -> None:
    client = cluster.client()
    with pytest.raises(openai.BadRequestError, match="tool_choice names 'nope'"):
        client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=[WEATHER],
            tool_choice=NOPE,
        )
    bad: Any = {
        "type": "json_schema",
        "json_schema": {"name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
    }
    with pytest.raises(openai.BadRequestError, match="cannot constrain the output"):
        client.chat.completions.create(model="tiny", messages=ASK, response_format=bad)
