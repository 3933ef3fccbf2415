"""The pure parts of Anthropic's Messages API: a request -> the chat task it becomes, a task's events
-> the stream's events, and the error shapes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from events.catalogue import ChatMessage, ChunkGenerated, PrefillStarted, TaskCompleted, TaskFailed, ToolCall, Usage
from events.constraints import ToolCallRequired
from events.ids import TaskId
from runner.models.tool_formats import JSON_TOOLS
from services.api.anthropic_errors import anthropic_error_for, problem_message
from services.api.messages_format import MessageEvents, error_kind, message, stop_reason
from services.api.messages_schemas import (
    ANTHROPIC_DEFAULT_TEMPERATURE,
    UNSUPPORTED_MESSAGES_FIELDS,
    chat_messages,
    decode_count_tokens_request,
    decode_messages_request,
    to_task,
)
from services.api.schemas import RequestProblem
from services.api.tool_calls import ToolCallSplitter, split_text
from services.api.tool_parsers import tool_parser
from tests.events.builders import Events

ev = Events()
TOOL: dict[str, Any] = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CLOCK: dict[str, Any] = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}


def _request(**fields: Any) -> bytes:
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.json.encode(body)


def _task(**fields: Any):
    return to_task(decode_messages_request(_request(**fields)), max_tokens_limit=100)


def test_system_blocks_tool_use_and_tool_results_become_the_chat_conversation() -> None:
    request = decode_messages_request(
        _request(
            system=[
                {"type": "text", "text": "Be "},
                {"type": "text", "text": "brief.", "cache_control": {"type": "ephemeral"}},
            ],
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Oslo?"}],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "Rain"}],
                        },
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no clock", "is_error": True},
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
        )
    )
    assert chat_messages(request) == [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Oslo?"),
        ChatMessage(
            role="assistant",
            content="Checking.",
            tool_calls=[
                ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Oslo"}'),
                ToolCall(id="toolu_2", name="get_time", arguments="{}"),
            ],
        ),
        ChatMessage(role="tool", content="Rain", tool_call_id="toolu_1"),
        ChatMessage(role="tool", content="Error: no clock", tool_call_id="toolu_2"),
        ChatMessage(role="user", content="Thanks"),
    ]
    only_results = decode_messages_request(
        _request(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x"}]}])
    )
    assert chat_messages(only_results) == [ChatMessage(role="tool", content="x", tool_call_id="a")]


def test_sampling_stops_and_tool_choices_become_task_params() -> None:
    _, params = _task()
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (
        ANTHROPIC_DEFAULT_TEMPERATURE,
        1.0,
        0,
        8,
    )
    _, params = _task(temperature=0, top_p=0.5, top_k=7, stop_sequences=["\n\n", "END"], metadata={"user_id": "u"})
    assert (params.temperature, params.top_p, params.top_k, params.stop) == (0.0, 0.5, 7, ["\n\n", "END"])
    assert _task(tools=[TOOL])[1].constraint is None and [t.name for t in _task(tools=[TOOL])[1].tools] == [
        "get_weather"
    ]
    assert _task(tools=[TOOL, CLOCK], tool_choice={"type": "any"})[1].constraint == ToolCallRequired(
        names=["get_weather", "get_time"]
    )
    named = _task(
        tools=[TOOL, CLOCK], tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}
    )
    assert named[1].constraint == ToolCallRequired(names=["get_time"])
    assert _task(tools=[TOOL], tool_choice={"type": "none"})[1].tools == []
    assert json.loads(_task(tools=[TOOL])[1].tools[0].parameters) == TOOL["input_schema"]
    assert _task(thinking={"type": "disabled"}, output_config={}, service_tier="auto")[1].max_tokens == 8


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"max_tokens": 101}, "max_tokens", "limit of 100"),
        ({"tool_choice": {"type": "any"}}, "tool_choice", "has no tools"),
        ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "x"}}, "tool_choice", "'x'"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "messages[1]",
            "prefilled",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}]}]},
            "messages[0].content[0]",
            "assistant turn",
        ),
        ({"stop_sequences": ["x" * 1025]}, "stop_sequences", "bytes"),
    ],
)
def test_requests_no_task_can_follow_are_refused_naming_the_field(
    fields: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(RequestProblem) as refused:
        _task(**fields)
    assert refused.value.status == 400 and refused.value.param == param and says in refused.value.message


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking", "extended thinking"),
        *[({name: {"not": "default"}}, name, f"`{name}`") for name in UNSUPPORTED_MESSAGES_FIELDS],
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
            "image",
        ),
        ({"system": [{"type": "document"}]}, "system[0].type", "document"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type", "server tools"),
        ({"temperature": 1.5}, "temperature", "<= 1.0"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "role"),
    ],
)
def test_fields_and_blocks_shoal_does_not_serve_are_refused_by_name(
    fields: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(RequestProblem) as refused:
        decode_messages_request(_request(**fields))
    assert refused.value.param == param and says in refused.value.message


def test_count_tokens_takes_no_max_tokens() -> None:
    assert decode_count_tokens_request(b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}').model == "m"


def _chunk(text: str) -> ChunkGenerated:
    return ChunkGenerated(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), index=0, text=text, token_ids=[1])


def _completed(finish: Any = "stop", stop_sequence: str | None = None) -> TaskCompleted:
    usage = Usage(prompt_tokens=20, completion_tokens=5, cached_tokens=8)
    return TaskCompleted(
        env=ev.task_rank("t1").stamp(),
        task_id=TaskId("t1"),
        finish_reason=finish,
        usage=usage,
        stop_sequence=stop_sequence,
    )


def _prefill_started() -> PrefillStarted:
    return PrefillStarted(
        env=ev.task_rank("t1").stamp(),
        task_id=TaskId("t1"),
        rank=0,
        path="pipeline",
        prompt_tokens=20,
        chunks=1,
        step=64,
        cached_tokens=8,
    )


def _events(stream: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    parsed: list[tuple[str, dict[str, Any]]] = []
    for raw in stream:
        head, data = raw.decode().strip().split("\n")
        name = head.removeprefix("event: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name  # Anthropic's events name their type twice
        parsed.append((name, payload))
    return parsed


def test_a_text_stream_is_one_text_block_between_message_start_and_message_stop() -> None:
    shape = MessageEvents("msg_t1", "tiny", splitter=None)
    assert shape.opening() == []  # message_start waits for the runner's prompt size
    stream = [
        *shape.chunks(_prefill_started()),
        *shape.chunks(_prefill_started()),  # every rank says it: one message_start
        *shape.chunks(_chunk("Hel")),
        *shape.chunks(_chunk("lo")),
        *shape.chunks(_completed("stop", "END")),
    ]
    events = _events(stream)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["usage"] == {
        "input_tokens": 12,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
    }
    assert "".join(p["delta"]["text"] for n, p in events if n == "content_block_delta") == "Hello"
    delta = events[6][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert delta["usage"] == {
        "input_tokens": 12,
        "output_tokens": 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
    }


def test_a_tool_call_in_the_stream_is_its_own_block_with_its_input_as_one_json_delta() -> None:
    shape = MessageEvents(
        "msg_t1", "tiny", ToolCallSplitter(parser=tool_parser(JSON_TOOLS), call_id=lambda n: f"toolu_t1_{n}")
    )
    text = 'Let me see. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    stream = [
        *shape.chunks(_prefill_started()),
        *(c for piece in (text[:15], text[15:40], text[40:]) for c in shape.chunks(_chunk(piece))),
    ]
    stream += shape.chunks(_completed("stop"))
    events = _events(stream)
    starts = [p["content_block"] for n, p in events if n == "content_block_start"]
    assert starts == [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "toolu_t1_0", "name": "get_weather", "input": {}},
    ]
    json_deltas = [
        p["delta"]["partial_json"] for n, p in events if p.get("delta", {}).get("type") == "input_json_delta"
    ]
    assert [json.loads(d) for d in json_deltas] == [{"city": "Oslo"}]
    assert [p["index"] for n, p in events if n == "content_block_stop"] == [0, 1]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"

    splitter = ToolCallSplitter(parser=tool_parser(JSON_TOOLS), call_id=lambda n: f"toolu_t1_{n}")
    whole = message("msg_t1", "tiny", split_text(splitter, text), _completed("stop"))
    body = msgspec.to_builtins(whole)
    assert body["content"] == [
        {"type": "text", "text": "Let me see. "},
        {"type": "tool_use", "id": "toolu_t1_0", "name": "get_weather", "input": {"city": "Oslo"}},
    ]
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None


def test_a_task_cancelled_before_its_prefill_still_starts_and_ends_its_message() -> None:
    shape = MessageEvents("msg_t1", "tiny", splitter=None)
    names = [name for name, _ in _events(shape.chunks(_completed("cancelled")))]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]


def test_a_failed_task_ends_the_stream_with_an_error_event() -> None:
    shape = MessageEvents("msg_t1", "tiny", splitter=None)
    failed = TaskFailed(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), error="boom", invalid_request=True)
    assert _events(shape.chunks(failed)) == [
        ("error", {"type": "error", "error": {"type": "invalid_request_error", "message": "boom"}})
    ]


@pytest.mark.parametrize(
    ("finish", "stop_sequence", "called", "reason"),
    [
        ("stop", None, False, "end_turn"),
        ("stop", "END", False, "stop_sequence"),
        ("stop", None, True, "tool_use"),
        ("length", None, True, "max_tokens"),
        ("length", None, False, "max_tokens"),
        ("cancelled", None, False, "end_turn"),
    ],
)
def test_stop_reasons(finish: Any, stop_sequence: str | None, called: bool, reason: str) -> None:
    assert stop_reason(finish, stop_sequence, called) == reason


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (408, "timeout_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ],
)
def test_error_kinds_follow_anthropics_by_status(status: int, kind: str) -> None:
    assert error_kind(status) == kind
    response = anthropic_error_for(RequestProblem(status, "why", param="messages[0]"))
    assert response.status_code == status
    assert json.loads(bytes(response.body)) == {"type": "error", "error": {"type": kind, "message": "messages[0]: why"}}


def test_a_problems_field_leads_its_message_once() -> None:
    assert (
        problem_message(RequestProblem(400, "max_tokens=9 is too many", param="max_tokens"))
        == "max_tokens=9 is too many"
    )
    assert problem_message(RequestProblem(400, "too long", param="system")) == "system: too long"
    assert problem_message(RequestProblem(400, "bad")) == "bad"
