"""`shoal up` driven by the official `anthropic` client: Messages, streamed and not, stop sequences,
a tool-use round trip, count_tokens, and keys sent as `x-api-key` (the client's own way) or as a
bearer token. The cluster requires a key, so every call here also proves the key is read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.helpers import one_rank_text

pytestmark = pytest.mark.timeout(240)

KEY = "sk-anthropic-test-key"
PROMPT = "Tell me about the river"
GREEDY = {"temperature": 0.0}  # Anthropic's default is 1.0; the SDK 2.x sends sampling via extra_body
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
CLOCK: Any = {"name": "get_time", "description": "The time", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("cluster"), workers=1, api_keys=KEY)
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def client(cluster: Cluster, **keys: Any) -> anthropic.Anthropic:
    keys = keys or {"api_key": KEY}
    return anthropic.Anthropic(base_url=cluster.base_url, max_retries=0, timeout=60, **keys)


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def reference(cluster: Cluster) -> str:
    return one_rank_text(cluster.env, PROMPT, 12)


def test_a_message_streamed_or_not_is_the_one_rank_greedy_text(cluster: Cluster, reference: str) -> None:
    claude = client(cluster)
    made = claude.messages.create(model="tiny", max_tokens=12, messages=user(PROMPT), extra_body=GREEDY)
    assert made.type == "message" and made.role == "assistant" and made.id.startswith("msg_task_")
    assert [block.type for block in made.content] == ["text"]
    assert made.content[0].text == reference  # pyright: ignore[reportAttributeAccessIssue]
    assert made.stop_reason in ("end_turn", "max_tokens") and made.stop_sequence is None
    assert 0 < made.usage.output_tokens <= 12
    assert made.usage.input_tokens + (made.usage.cache_read_input_tokens or 0) > 5
    if made.stop_reason == "max_tokens":
        assert made.usage.output_tokens == 12

    with claude.messages.stream(model="tiny", max_tokens=12, messages=user(PROMPT), extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == reference  # pyright: ignore[reportAttributeAccessIssue]
    assert final.stop_reason == made.stop_reason and final.usage.output_tokens == made.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_stop", "message_delta"} <= set(kinds)


def test_system_and_a_conversation_in_text_blocks(cluster: Cluster) -> None:
    made = client(cluster).messages.create(
        model="tiny",
        max_tokens=4,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]},
            {"role": "user", "content": "And the sea?"},
        ],
        metadata={"user_id": "someone"},
        extra_body={"top_k": 5, "top_p": 0.9, "temperature": 0.7},
    )
    assert made.usage.output_tokens > 0 and made.stop_reason in ("end_turn", "max_tokens")


def test_a_stop_sequence_cuts_the_text_and_is_named(cluster: Cluster) -> None:
    full = one_rank_text(cluster.env, PROMPT, 16)
    stop = full[6:9]
    assert stop and stop in full
    claude = client(cluster)
    made = claude.messages.create(
        model="tiny",
        max_tokens=16,
        messages=user(PROMPT),
        stop_sequences=[stop, "never-in-the-text"],
        extra_body=GREEDY,
    )
    assert made.content[0].text == full[: full.index(stop)]  # pyright: ignore[reportAttributeAccessIssue]
    assert (made.stop_reason, made.stop_sequence) == ("stop_sequence", stop)
    with claude.messages.stream(
        model="tiny", max_tokens=16, messages=user(PROMPT), stop_sequences=[stop], extra_body=GREEDY
    ) as stream:
        assert "".join(stream.text_stream) == full[: full.index(stop)]
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_a_tool_use_round_trip(cluster: Cluster, choice: Any) -> None:
    """The model is made to call a tool (by grammar, as chat's `required` and named choices); its
    call comes back as a tool_use block whose input follows the tool's schema, and the result goes
    back in a tool_result block."""
    claude = client(cluster)
    asked = user("What is the weather in Paris?")
    tools = [WEATHER, CLOCK]
    made = claude.messages.create(
        model="tiny", max_tokens=200, messages=asked, tools=tools, tool_choice=choice, extra_body=GREEDY
    )
    assert made.stop_reason == "tool_use"
    calls = [block for block in made.content if block.type == "tool_use"]
    assert len(calls) == 1 and calls[0].id.startswith("toolu_")
    assert calls[0].name == choice.get("name", calls[0].name)
    schema = WEATHER if calls[0].name == "get_weather" else CLOCK
    jsonschema.validate(calls[0].input, schema["input_schema"])

    with claude.messages.stream(
        model="tiny", max_tokens=200, messages=asked, tools=tools, tool_choice=choice, extra_body=GREEDY
    ) as stream:
        kinds = [(event.type, getattr(getattr(event, "delta", None), "type", None)) for event in stream]
        streamed = stream.get_final_message()
    assert ("content_block_delta", "input_json_delta") in kinds
    assert streamed.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == [
        (b.type, getattr(b, "input", None)) for b in made.content
    ]

    result: Any = {"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 21C"}
    replayed: Any = {"role": "assistant", "content": [block.model_dump() for block in made.content]}
    answered = claude.messages.create(
        model="tiny",
        max_tokens=8,
        tools=tools,
        messages=[*asked, replayed, {"role": "user", "content": [result]}],
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
    assert answered.stop_reason in ("end_turn", "max_tokens")
    assert answered.content and all(block.type == "text" for block in answered.content)
    prompt = answered.usage.input_tokens + (answered.usage.cache_read_input_tokens or 0)
    assert prompt > claude.messages.count_tokens(model="tiny", messages=asked).input_tokens + 10  # call and result


def test_count_tokens_is_the_prompt_the_runner_sees(cluster: Cluster) -> None:
    claude = client(cluster)
    counted = claude.messages.count_tokens(model="tiny", messages=user(PROMPT))
    made = claude.messages.create(model="tiny", max_tokens=1, messages=user(PROMPT), extra_body=GREEDY)
    assert counted.input_tokens == made.usage.input_tokens + (made.usage.cache_read_input_tokens or 0)
    with_tools = claude.messages.count_tokens(model="tiny", messages=user(PROMPT), tools=[WEATHER])
    assert with_tools.input_tokens > counted.input_tokens  # the template shows the tools


def test_keys_are_read_from_x_api_key_or_a_bearer_token(cluster: Cluster) -> None:
    as_bearer = client(cluster, auth_token=KEY).messages.create(
        model="tiny", max_tokens=2, messages=user(PROMPT), extra_body=GREEDY
    )
    assert as_bearer.usage.output_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client(cluster, api_key="not-the-key").messages.create(model="tiny", max_tokens=2, messages=user(PROMPT))
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "the API key is not valid"},
    }
    with httpx.Client(base_url=cluster.base_url) as http:
        missing = http.post("/v1/messages", json={"model": "tiny", "max_tokens": 2, "messages": user(PROMPT)})
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    assert "x-api-key" in missing.json()["error"]["message"]


def test_refusals_are_the_clients_own_exceptions(cluster: Cluster) -> None:
    claude = client(cluster)
    with pytest.raises(anthropic.NotFoundError) as unknown:
        claude.messages.create(model="no-such-model", max_tokens=2, messages=user(PROMPT))
    assert unknown.value.body["error"]["type"] == "not_found_error"  # pyright: ignore[reportIndexIssue, reportOptionalSubscript]
    with pytest.raises(anthropic.BadRequestError) as thinking:
        claude.messages.create(
            model="tiny", max_tokens=2, messages=user(PROMPT), thinking={"type": "enabled", "budget_tokens": 1024}
        )
    assert "thinking" in str(thinking.value)
    image: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as picture:
        claude.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": [image]}])
    assert "image" in str(picture.value)


def test_the_message_id_names_its_task(cluster: Cluster) -> None:
    made = client(cluster).messages.create(model="tiny", max_tokens=2, messages=user(PROMPT), extra_body=GREEDY)
    with httpx.Client(base_url=cluster.base_url, headers={"x-api-key": KEY}) as http:
        task = http.get(f"/v1/tasks/{made.id}")
    assert task.status_code == 200 and task.json()["status"] == "completed"
    assert json.loads(task.content)["task_id"] == made.id.removeprefix("msg_")
