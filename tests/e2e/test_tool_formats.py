"""Tool calls in other families' formats on a live cluster, driven by the official `openai` and
`anthropic` clients: tiny random models with Llama 3.1's and Mistral v0.3's tokens and chat
templates (`shoal model make-tiny --family`). A forced call (`required`, named, Anthropic's `any`)
is written by the grammar in the family's own format and comes back parsed, every time, on chat,
responses and messages, streamed and not; the call goes back to the model through its template (a
tool round trip, Mistral's 9-character call ids included); Codex CLI's request shape is served; bad
input is a 4xx in the route's own error shape and the same runners serve the next request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from openai.types.responses import ResponseCompletedEvent, ResponseFunctionToolCall

from runner.models.tiny_families import Family, make_tiny_family
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER: Any = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city", "parameters": CITY_SCHEMA},
}
CLOCK: Any = {
    "type": "function",
    # closed: an open object lets a random model write keys until max_tokens cuts the call
    "function": {
        "name": "get_time",
        "description": "The time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {"get_weather": CITY_SCHEMA, "get_time": CLOCK["function"]["parameters"]}


@pytest.fixture(scope="module", params=["llama3", "mistral"])
def family(request: pytest.FixtureRequest) -> Family:
    return request.param


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, family: Family) -> Iterator[Cluster]:
    model = make_tiny_family(tmp_path_factory.mktemp("models") / family, family)
    running = Cluster(tmp_path_factory.mktemp("cluster"), workers=1, models=str(model))
    try:
        yield running.wait_ready()
    finally:
        running.stop()


@pytest.fixture(scope="module")
def model(cluster: Cluster) -> str:
    return cluster.env["SHOAL_MODELS"]


def _checked(name: str, arguments: str) -> dict[str, Any]:
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, SCHEMAS[name])
    return parsed


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_chat_forced_call_is_parsed_every_time(cluster: Cluster, model: str, choice: Any, seed: int) -> None:
    """Sampled (temperature 1, three seeds), the random model still writes one call in its format."""
    client = cluster.client()
    made = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice=choice,
        max_tokens=200,
        temperature=1.0,
        seed=seed,
    )
    answer = made.choices[0]
    assert answer.finish_reason == "tool_calls", answer
    calls: Any = answer.message.tool_calls
    assert calls is not None and len(calls) == 1 and not answer.message.content
    if choice != "required":
        assert calls[0].function.name == "get_time"
    _checked(calls[0].function.name, calls[0].function.arguments)

    names: list[str] = []
    arguments: dict[int, str] = {}
    finish = None
    for chunk in client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice=choice,
        max_tokens=200,
        temperature=1.0,
        seed=seed,
        stream=True,
    ):
        if not chunk.choices:
            continue
        delta: Any = chunk.choices[0].delta
        assert not delta.content  # the call's markup never leaks as content
        for call in delta.tool_calls or []:
            if call.function.name:
                names.append(call.function.name)
            arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(names) == 1
    _checked(names[0], arguments[0])


def test_a_tool_round_trip_goes_back_through_the_template(cluster: Cluster, model: str, family: Family) -> None:
    """The call's id comes back with its result; Mistral's template takes only 9-character ids,
    which shoal gives its calls."""
    client = cluster.client()
    made = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,  # accepted: one call at most (forced: one by grammar)
        max_tokens=200,
        temperature=0,
    )
    call: Any = (made.choices[0].message.tool_calls or [])[0]
    if family == "mistral":
        assert len(call.id) == 9 and call.id.isalnum()
    turn: Any = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    answer = client.chat.completions.create(model=model, messages=turn, tools=[WEATHER], max_tokens=6, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage is not None and answer.usage.prompt_tokens > made.usage.prompt_tokens  # pyright: ignore[reportOptionalMemberAccess]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_forced_call_is_a_function_call_item(cluster: Cluster, model: str, stream: bool) -> None:
    client = cluster.client()
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": CITY_SCHEMA}]
    asked: dict[str, Any] = {
        "model": model,
        "input": "What is the weather in Paris?",
        "tools": tools,
        "tool_choice": "required",
        "max_output_tokens": 200,
    }
    if stream:
        events = list(client.responses.create(**asked, stream=True))
        final = events[-1]
        assert isinstance(final, ResponseCompletedEvent)
        response = final.response
    else:
        response = client.responses.create(**asked)
    calls = [item for item in response.output if isinstance(item, ResponseFunctionToolCall)]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    _checked("get_weather", calls[0].arguments)


def test_codex_clis_request_is_served(cluster: Cluster, model: str) -> None:
    """Codex CLI's shape: stateless, one call at a time, reasoning asked with a summary and its
    encrypted content, the conversation replayed with a call, its output and a reasoning item."""
    client = cluster.client()
    tools: Any = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "weather",
            "parameters": CITY_SCHEMA,
            "strict": False,
        },
        {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}, "strict": False},
    ]
    first = client.responses.create(
        model=model,
        instructions="You are a coding agent.",
        input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]}],
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        reasoning={"summary": "auto"},
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="codex-session",
        max_output_tokens=200,
    )
    assert first.parallel_tool_calls is False
    call = next(item for item in first.output if isinstance(item, ResponseFunctionToolCall))
    replay: Any = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "rain"},
    ]
    events = list(
        client.responses.create(
            model=model,
            instructions="You are a coding agent.",
            input=replay,
            tools=tools,
            tool_choice="auto",
            parallel_tool_calls=False,
            reasoning={"summary": "auto"},
            store=False,
            include=["reasoning.encrypted_content"],
            max_output_tokens=8,
            stream=True,
        )
    )
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    calls = [item for item in final.response.output if isinstance(item, ResponseFunctionToolCall)]  # pyright: ignore[reportAttributeAccessIssue]
    assert len(calls) <= 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_forced_tool_use_in_the_families_format(cluster: Cluster, model: str, stream: bool) -> None:
    claude = anthropic.Anthropic(base_url=cluster.base_url, api_key="shoal", max_retries=0, timeout=60)
    tools: Any = [{"name": "get_weather", "description": "weather", "input_schema": CITY_SCHEMA}]
    asked: dict[str, Any] = {
        "model": model,
        "max_tokens": 200,
        "messages": ASK,
        "tools": tools,
        "tool_choice": {"type": "any"},
    }
    if stream:
        with claude.messages.stream(**asked) as events:
            made = events.get_final_message()
    else:
        made = claude.messages.create(**asked)
    assert made.stop_reason == "tool_use"
    uses: Any = [block for block in made.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, CITY_SCHEMA)
    assert all(block.type != "text" or not block.text for block in made.content)  # pyright: ignore[reportAttributeAccessIssue]


def _hostile(family: Family) -> dict[str, tuple[str, dict[str, Any]]]:
    """Bad requests, each for a route: (path, body without the model)."""
    bad_id: Any = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "x", "content": "sunny"},
    ]
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "named tool not offered": ("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        "arguments not JSON": (
            "/v1/chat/completions",
            {"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {"name": "get_weather", "arguments": "{"}}]}]},
        ),
        "include logprobs": ("/v1/responses", {"input": "hi", "include": ["message.output_text.logprobs"]}),
        "messages tool not offered": ("/v1/messages", {"max_tokens": 8, "messages": ASK, "tools": [{"name": "t", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "x"}}),
    }  # fmt: skip
    if family == "mistral":  # the published template refuses a call id that is not 9 characters
        cases["call id the template refuses"] = ("/v1/chat/completions", {"messages": bad_id, "tools": [WEATHER]})
    return cases


def test_hostile_input_is_a_4xx_in_the_routes_shape_and_the_next_request_is_served(
    cluster: Cluster, model: str, family: Family
) -> None:
    pids = cluster.runner_pids()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        for name, (path, body) in _hostile(family).items():
            refused = http.post(
                path,
                json={"model": model, "max_tokens": 8, **body} if path != "/v1/responses" else {"model": model, **body},
            )
            assert 400 <= refused.status_code < 500, (name, refused.text)
            shape = refused.json()
            if path == "/v1/messages":
                assert shape["type"] == "error" and shape["error"]["type"] == "invalid_request_error", name
            else:
                assert set(shape["error"]) == {"message", "type", "param", "code"}, name
                assert shape["error"]["type"] == "invalid_request_error" and shape["error"]["message"], name
    answer = cluster.client().chat.completions.create(model=model, messages=ASK, max_tokens=4)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert cluster.runner_pids() == pids
