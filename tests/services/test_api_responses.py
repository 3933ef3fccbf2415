"""The pure parts of `/v1/responses`: the request as the chat request it amounts to, what is
refused and why, and a task's output as the Responses events and object."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from events.catalogue import ChatMessage, ToolCall, Usage
from events.constraints import JsonSchema, ToolCallRequired
from services.api.responses_api import in_responses_terms
from services.api.responses_api_format import Response, ResponseBuilder, event_sse
from services.api.responses_api_schemas import (
    PlainText,
    TextConfig,
    decode_responses_request,
    to_chat_request,
)
from services.api.schemas import RequestProblem, to_task

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _task(**fields: Any) -> tuple[list[ChatMessage], Any]:
    body = {"model": "tiny", "input": "hi", **fields}
    return to_task(to_chat_request(decode_responses_request(msgspec.json.encode(body))), max_tokens_limit=100)


def test_text_input_and_instructions_are_a_system_and_a_user_message() -> None:
    messages, params = _task(instructions="be brief", max_output_tokens=7, temperature=0.5, top_p=0.9)
    assert [(m.role, m.content) for m in messages] == [("system", "be brief"), ("user", "hi")]
    assert (params.max_tokens, params.temperature, params.top_p) == (7, 0.5, 0.9)


def test_message_items_and_a_tool_round_trip_become_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "use tools"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "in Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Bergen"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "function_call_output", "call_id": "c2", "output": "sun"},
    ]  # fmt: skip
    messages, params = _task(input=items, tools=[WEATHER])
    assert [m.role for m in messages] == ["developer", "user", "assistant", "tool", "tool"]
    assert messages[1].content == "weather in Oslo?"
    assistant = messages[2]
    assert assistant.content == "Let me look."
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("c1", "get_weather", '{"city":"Oslo"}'),
        ("c2", "get_weather", '{"city":"Bergen"}'),
    ]
    assert [(m.tool_call_id, m.content) for m in messages[3:]] == [("c1", "rain"), ("c2", "sun")]
    assert [t.name for t in params.tools] == ["get_weather"]


def test_what_codex_cli_sends_is_accepted() -> None:
    """Codex CLI's request: stateless, one call at a time, reasoning asked with a summary and its
    encrypted content, a past turn's reasoning, call and result replayed."""
    codex = {
        "instructions": "You are a coding agent.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ],
        "tools": [{**WEATHER, "strict": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session-1",
    }
    messages, params = _task(**codex)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    chat = to_chat_request(decode_responses_request(msgspec.json.encode({"model": "tiny", **codex})))
    assert chat.parallel_tool_calls is False  # the splitter keeps one call (`max_calls`)
    assert params.enable_thinking is True and [t.name for t in params.tools] == ["get_weather"]


def test_reasoning_effort_is_the_templates_thinking_switch() -> None:
    assert _task()[1].enable_thinking is None
    assert _task(reasoning={"effort": "none"})[1].enable_thinking is False
    assert _task(reasoning={"effort": "low"})[1].enable_thinking is True


def test_tool_choice_and_text_format_become_the_chat_constraints() -> None:
    assert _task(tools=[WEATHER], tool_choice="required")[1].constraint == ToolCallRequired(names=["get_weather"])
    named = {"type": "function", "name": "get_weather"}
    assert _task(tools=[WEATHER], tool_choice=named)[1].constraint == ToolCallRequired(names=["get_weather"])
    assert _task(tools=[WEATHER], tool_choice="none")[1].tools == []
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    text = {"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": True}}
    assert _task(text=text)[1].constraint == JsonSchema(name="s", schema=json.dumps(schema))


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "no server-side conversation state"),
        ({"conversation": "conv_1"}, "conversation", "no server-side conversation state"),
        ({"store": True}, "store", "no server-side conversation state"),
        ({"background": True}, "background", "does not implement `background`"),
        ({"reasoning": {"summary": "verbose"}}, "reasoning.summary", "Invalid enum value"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "Invalid enum value"),
        ({"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}, "include[1]", "returns no logprobs"),
        ({"include": ["everything"]}, "include[0]", "Invalid enum value"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls", "Expected `bool"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "no built-in tools"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type", "input_text"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "keeps no items"),
        ({"input": []}, "input", "length"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "is missing"),
        ({"input": [{"type": "message", "content": "x"}]}, "input[0].role", "is missing"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input", "not JSON"),
        ({"max_output_tokens": 101}, "max_output_tokens", "max_output_tokens=101 exceeds"),
        ({"tool_choice": "required"}, "tool_choice", "has no tools"),
        ({"tools": [WEATHER], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format", "text.format cannot"),
        ({"text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "nope"}}}}, "text.format", "cannot constrain"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_a_400_naming_the_field(fields: dict[str, Any], param: str, says: str) -> None:
    with pytest.raises(RequestProblem) as raised:
        try:
            _task(**fields)
        except RequestProblem as problem:
            raise in_responses_terms(problem) from problem
    assert raised.value.status == 400
    assert raised.value.param == param
    assert says in raised.value.message


def _start() -> Response:
    return Response(
        id="resp_task_1", object="response", created_at=1, status="in_progress", model="tiny", output=[],
        usage=None, error=None, incomplete_details=None, instructions=None, max_output_tokens=None,
        temperature=0.0, top_p=1.0, tools=[], tool_choice="auto", parallel_tool_calls=True,
        text=TextConfig(format=PlainText()), store=False, metadata={}, shoal_finish_reason=None,
    )  # fmt: skip


def _builtins(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [msgspec.json.decode(msgspec.json.encode(e)) for e in events]


def test_text_then_a_call_then_text_streams_three_items_in_order() -> None:
    builder = ResponseBuilder(_start())
    events = builder.opening() + builder.text("Hel") + builder.text("lo")
    events += builder.call(ToolCall(id="call_1", name="f", arguments='{"a":1}')) + builder.text("after")
    ending, final = builder.finished("stop", Usage(prompt_tokens=5, completion_tokens=9, cached_tokens=2))
    events = _builtins(events + ending)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert events[6]["text"] == "Hello" and events[6]["output_index"] == 0
    assert events[9]["output_index"] == 1 and events[9]["item"]["arguments"] == ""
    assert events[12]["item"] == {
        "type": "function_call", "id": "fc_call_1", "call_id": "call_1", "name": "f",
        "arguments": '{"a":1}', "status": "completed",
    }  # fmt: skip
    assert events[13]["output_index"] == 2 and events[13]["item"]["id"] != events[2]["item"]["id"]
    done = _builtins([msgspec.to_builtins(final)])[0]
    assert events[-1]["response"] == done
    assert done["status"] == "completed" and done["shoal_finish_reason"] == "stop"
    assert [i["type"] for i in done["output"]] == ["message", "function_call", "message"]
    assert done["output"][0]["content"][0]["text"] == "Hello"
    assert done["usage"] == {
        "input_tokens": 5, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("finish", "status", "event", "details"),
    [
        ("length", "incomplete", "response.incomplete", {"reason": "max_output_tokens"}),
        ("cancelled", "cancelled", "response.incomplete", None),
    ],
)
def test_a_task_cut_short_is_incomplete(finish: Any, status: str, event: str, details: object) -> None:
    builder = ResponseBuilder(_start())
    builder.opening()
    builder.text("x")
    ending, final = builder.finished(finish, Usage())
    assert [e["type"] for e in ending][-1] == event
    assert final.status == status
    assert msgspec.to_builtins(final.incomplete_details) == details


def test_a_failed_task_ends_the_stream_with_response_failed_and_its_error() -> None:
    builder = ResponseBuilder(_start())
    builder.opening()
    (event,) = _builtins(builder.failed("the grammar refused", invalid_request=True))
    assert event["type"] == "response.failed" and event["sequence_number"] == 2
    assert event["response"]["status"] == "failed"
    assert event["response"]["error"] == {"code": "invalid_prompt", "message": "the grammar refused"}


def test_events_are_sent_with_their_type_as_the_sse_event() -> None:
    sent = event_sse({"type": "response.created", "sequence_number": 0})
    assert sent == b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'


def test_reasoning_is_an_item_of_its_own_before_the_answer() -> None:
    builder = ResponseBuilder(_start())
    events = builder.opening() + builder.reasoning("hm") + builder.reasoning("m") + builder.text("Hi")
    ending, final = builder.finished("stop", Usage())
    kinds = [e["type"] for e in _builtins(events + ending)]
    assert kinds[2:] == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    reasoning, message = msgspec.to_builtins(final.output)
    assert reasoning == {
        "type": "reasoning", "id": "rs_task_1", "status": "completed", "summary": [],
        "content": [{"type": "reasoning_text", "text": "hmm"}],
    }  # fmt: skip
    assert message["type"] == "message" and message["content"][0]["text"] == "Hi"
