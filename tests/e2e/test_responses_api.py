"""`/v1/responses` on `shoal up --workers 2`, driven by the official openai client's
`responses.create` (streamed and not) and `responses.stream`: the same task as the chat request
it amounts to, tools forced by grammar, text.format held to its schema, and what is refused."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import ResponseCompletedEvent, ResponseIncompleteEvent, ResponseTextDeltaEvent

from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

PROMPT = "Tell me about the river"
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _chat_text(client: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int) -> str:
    completion = client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens)  # pyright: ignore[reportArgumentType, reportCallIssue]
    return completion.choices[0].message.content or ""


def test_a_response_is_the_chat_completion_of_the_same_messages(cluster: Cluster) -> None:
    """Greedy: the same prompt through both routes is the same task, so the same text."""
    client = cluster.client()
    expected = _chat_text(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}], 12)
    response = client.responses.create(model="tiny", instructions="Be brief.", input=PROMPT, max_output_tokens=12)
    assert response.output_text == expected
    assert response.id.startswith("resp_task_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    usage = response.usage
    assert usage is not None and usage.input_tokens > 5 and 0 < usage.output_tokens <= 12
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert usage.output_tokens == 12


def test_streamed_events_add_up_to_the_same_response(cluster: Cluster) -> None:
    client = cluster.client()
    plain = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=10)
    events = list(client.responses.create(model="tiny", input=PROMPT, max_output_tokens=10, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if plain.status == "incomplete" else "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
    assert deltas == plain.output_text
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent | ResponseIncompleteEvent)
    assert last.response.output_text == plain.output_text
    usage, plain_usage = last.response.usage, plain.usage
    assert usage is not None and plain_usage is not None  # cached_tokens differ: the second one hits the prefix cache
    assert (usage.input_tokens, usage.output_tokens) == (plain_usage.input_tokens, plain_usage.output_tokens)


def test_the_stream_helper_assembles_the_final_response(cluster: Cluster) -> None:
    """`get_final_response` wants `response.completed` (an answer cut at max_output_tokens ends
    `response.incomplete`, for OpenAI's own too), so the answer is held to a short schema."""
    text: Any = {"format": {"type": "json_schema", "name": "person", "schema": PERSON}}
    with cluster.client().responses.stream(model="tiny", input=PROMPT, text=text, max_output_tokens=200) as stream:
        texts = [e.delta for e in stream if isinstance(e, ResponseTextDeltaEvent)]
        final = stream.get_final_response()
    assert final.output_text == "".join(texts)
    jsonschema.validate(json.loads(final.output_text), PERSON)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_named_tool_choice_forces_a_call_and_its_result_goes_back(cluster: Cluster, stream: bool) -> None:
    client = cluster.client()
    asked: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice: Any = {"type": "function", "name": "get_weather"}
    if stream:
        with client.responses.stream(
            model="tiny", input=asked, tools=[WEATHER], tool_choice=choice, max_output_tokens=200
        ) as events:
            kinds = [e.type for e in events]
            first = events.get_final_response()
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    else:
        first = client.responses.create(
            model="tiny", input=asked, tools=[WEATHER], tool_choice=choice, max_output_tokens=200
        )
    assert first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    follow_up: Any = [
        *asked,
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"sky": "clear"}'},
    ]
    answer = client.responses.create(model="tiny", input=follow_up, tools=[WEATHER], max_output_tokens=8)
    assert answer.output_text and answer.status in ("completed", "incomplete")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_text_format_json_schema_holds_the_answer_to_the_schema(cluster: Cluster, stream: bool) -> None:
    client = cluster.client()
    text: Any = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    if stream:
        events = list(
            client.responses.create(model="tiny", input="Who?", text=text, max_output_tokens=200, stream=True)
        )
        final = events[-1]
        assert isinstance(final, ResponseCompletedEvent)
        answer = final.response.output_text
    else:
        response = client.responses.create(model="tiny", input="Who?", text=text, max_output_tokens=200)
        assert response.status == "completed"
        answer = response.output_text
    jsonschema.validate(json.loads(answer), PERSON)


HOSTILE: dict[str, dict[str, Any]] = {
    "previous_response_id": {"previous_response_id": "resp_abc"},
    "store true": {"store": True},
    "background": {"background": True},
    "built-in tool": {"tools": [{"type": "web_search"}]},
    "image input": {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
    "item reference": {"input": [{"type": "item_reference", "id": "msg_1"}]},
    "empty input": {"input": []},
    "tool result without call_id": {"input": [{"type": "function_call_output", "output": "x"}]},
    "unknown role": {"input": [{"role": "wizard", "content": "hi"}]},
    "max_output_tokens 0": {"max_output_tokens": 0},
    "temperature 3": {"temperature": 3},
    "reasoning effort without a thinking switch": {"reasoning": {"effort": "high"}},
    "reasoning summary not offered": {"reasoning": {"summary": "verbose"}},
    "include logprobs": {"include": ["message.output_text.logprobs"]},
    "include unknown": {"include": ["everything"]},
    "named tool not offered": {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
    "bad schema": {"text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "nope"}}}},
    "unknown model": {"model": "no-such-model"},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_input_is_a_4xx_openai_error_and_the_next_request_is_served(cluster: Cluster, name: str) -> None:
    pids = cluster.runner_pids()
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 4, **HOSTILE[name]}
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        refused = http.post("/v1/responses", json=body)
    assert 400 <= refused.status_code < 500, refused.text
    error = refused.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"]
    with pytest.raises(openai.APIStatusError) as raised:  # the client raises it as itself, with the message
        cluster.client().responses.create(**body)
    assert raised.value.status_code == refused.status_code
    assert cluster.client().responses.create(model="tiny", input=PROMPT, max_output_tokens=4).output_text
    assert cluster.runner_pids() == pids


def test_previous_response_id_says_no_state_is_kept(cluster: Cluster) -> None:
    with pytest.raises(openai.BadRequestError, match="no server-side conversation state"):
        cluster.client().responses.create(model="tiny", input="hi", previous_response_id="resp_abc")
