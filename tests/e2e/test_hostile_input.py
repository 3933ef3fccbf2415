"""Hostile and odd input against a live `shoal up` (real NATS, real API, a real runner): each gets a
4xx in OpenAI's error shape, nothing crashes or retires the instance, and the next ordinary
request gets exactly the answer it got before. Then schemathesis fuzzes every operation of
`/openapi.json`: no 5xx, and every response matches its documented schema.

The cluster serves the tiny model with a strict chat template (tests/services/strict_model.py), so
a template's refusal is met for real, and caps max_tokens low so the fuzzer's accepted requests
finish quickly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.api.messages_schemas import MAX_STOP_SEQUENCES, UNSUPPORTED_MESSAGES_FIELDS
from services.api.schemas import MAX_STOP_BYTES, UNSUPPORTED_PARAMS
from tests.e2e.cluster import Cluster
from tests.services.strict_model import REFUSAL, strict_tiny_model

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS_LIMIT = 16
FUZZ_EXAMPLES = 50  # per operation and mode: the fuzz takes about half a minute on a small machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    model = strict_tiny_model(tmp_path_factory.mktemp("models") / "strict")
    running = Cluster(
        tmp_path_factory.mktemp("cluster"), workers=1, models=str(model), max_tokens_limit=str(MAX_TOKENS_LIMIT)
    )
    try:
        yield running.wait_ready()
    finally:
        running.stop()


@pytest.fixture(scope="module")
def model(cluster: Cluster) -> str:
    return cluster.env["SHOAL_MODELS"]


@pytest.fixture(scope="module")
def reference(cluster: Cluster, model: str) -> str:
    """The ordinary request's answer before any hostile input."""
    return ordinary_answer(cluster, model)


def ordinary_answer(cluster: Cluster, model: str) -> str:
    with cluster.http() as http:
        response = http.post("/v1/chat/completions", json=chat(model, content="Tell me about the river"))
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def chat(model: str, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8, **extra}


def hostile_requests(model: str) -> dict[str, dict[str, Any]]:
    """name -> httpx.request keyword arguments; each must be refused with a 4xx."""
    ok = chat(model)
    deep = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 100_000 + b"]" * 100_000
    requests: dict[str, dict[str, Any]] = {
        "empty messages": {"json": {**ok, "messages": []}},
        "form-encoded body": {"data": {"model": model, "messages": "hi"}},
        "not json": {"content": b"\x00\xff{", "headers": {"content-type": "application/json"}},
        "seed 2**64": {"json": {**ok, "seed": 2**64}},
        "negative seed": {"json": {**ok, "seed": -1}},
        "deeply nested unknown field": {"content": deep + b"}", "headers": {"content-type": "application/json"}},
        "max_tokens 0": {"json": {**ok, "max_tokens": 0}},
        "max_tokens over the limit": {"json": {**ok, "max_tokens": MAX_TOKENS_LIMIT + 1}},
        "five stop strings": {"json": {**ok, "stop": ["a", "b", "c", "d", "e"]}},
        "stop strings too long": {"json": {**ok, "stop": ["x" * (MAX_STOP_BYTES + 1)]}},
        "empty stop string": {"json": {**ok, "stop": [""]}},
        "temperature 3": {"json": {**ok, "temperature": 3}},
        "image content": {"json": {**ok, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}},
        "unknown role": {"json": {**ok, "messages": [{"role": "wizard", "content": "hi"}]}},
        "unknown model": {"json": {**ok, "model": "no-such-model"}},
        "prompt over the context": {"json": chat(model, content="river stone " * 3000)},
        "chat template refuses": {
            "json": {**ok, "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
        },
        "body over the limit": {"content": b" " * 1_100_000, "headers": {"content-type": "application/json"}},
        "schema nested past the grammar's limit": {"json": {**ok, "response_format": _deep_schema_format(150)}},
        "logit_bias on a token the model lacks": {"json": {**ok, "logit_bias": {"1000000": 5}}},
        "logit_bias key not a token id": {"json": {**ok, "logit_bias": {"river": 5}}},
        "frequency_penalty 3": {"json": {**ok, "frequency_penalty": 3}},
        "n 0": {"json": {**ok, "n": 0}},
        "n over max_choices": {"json": {**ok, "n": 9}},  # the default max_choices is 8
        "n with a json schema": {"json": {**ok, "n": 2, "response_format": _deep_schema_format(1)}},
        **{f"unsupported {name}": {"json": {**ok, name: {"not": "default"}}} for name in UNSUPPORTED_PARAMS},
    }
    return {name: {"method": "POST", "url": "/v1/chat/completions", **kw} for name, kw in requests.items()} | {
        "task id with a dot": {"method": "GET", "url": "/v1/tasks/a.b"},
        "task id wildcard cancel": {"method": "POST", "url": "/v1/tasks/%3E/cancel"},
        "empty completion prompt": {"method": "POST", "url": "/v1/completions", "json": {"model": model, "prompt": ""}},
        "unknown route": {"method": "GET", "url": "/v1/nothing"},
        "wrong method": {"method": "DELETE", "url": "/v1/chat/completions"},
    }


def _deep_schema_format(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}


HOSTILE = sorted(hostile_requests("m"))


def anthropic_hostile_requests(model: str) -> dict[str, dict[str, Any]]:
    """name -> httpx.request keyword arguments for the Anthropic routes; each must be refused with
    a 4xx in Anthropic's error shape."""
    ok: dict[str, Any] = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    tool: dict[str, Any] = {"name": "t", "input_schema": {"type": "object", "properties": {}}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}

    def user(*blocks: Any) -> dict[str, Any]:
        return {**ok, "messages": [{"role": "user", "content": list(blocks)}]}

    deep = b'{"model": "m", "max_tokens": 8, "messages": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    as_json = {"content-type": "application/json"}
    requests: dict[str, dict[str, Any]] = {
        "empty messages": {"json": {**ok, "messages": []}},
        "no max_tokens": {"json": {"model": model, "messages": ok["messages"]}},
        "max_tokens 0": {"json": {**ok, "max_tokens": 0}},
        "max_tokens over the limit": {"json": {**ok, "max_tokens": MAX_TOKENS_LIMIT + 1}},
        "not json": {"content": b"\x00\xff{", "headers": as_json},
        "form-encoded body": {"data": {"model": model, "messages": "hi"}},
        "deeply nested unknown field": {"content": deep, "headers": as_json},
        "body over the limit": {"content": b" " * 1_100_000, "headers": as_json},
        "temperature 1.5": {"json": {**ok, "temperature": 1.5}},
        "negative top_k": {"json": {**ok, "top_k": -1}},
        "role system in messages": {"json": {**ok, "messages": [{"role": "system", "content": "hi"}]}},
        "image block": {"json": user(image)},
        "document block": {"json": user(document)},
        "thinking block": {"json": user({"type": "thinking", "thinking": "hm", "signature": "s"})},
        "tool_use in a user turn": {"json": user({"type": "tool_use", "id": "a", "name": "t", "input": {}})},
        "tool_result in an assistant turn": {
            "json": {
                **ok,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]},
                    {"role": "user", "content": "and?"},
                ],
            }
        },
        "a final assistant turn (prefill)": {
            "json": {**ok, "messages": [*ok["messages"], {"role": "assistant", "content": "Sure"}]}
        },
        "server tool": {"json": {**ok, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}},
        "tool_choice names no tool": {"json": {**ok, "tools": [tool], "tool_choice": {"type": "tool", "name": "x"}}},
        "tool_choice any without tools": {"json": {**ok, "tool_choice": {"type": "any"}}},
        "schema the grammar refuses": {
            "json": {
                **ok,
                "tools": [{"name": "t", "input_schema": {"type": "nope"}}],
                "tool_choice": {"type": "any"},
            }
        },
        "too many stop_sequences": {"json": {**ok, "stop_sequences": ["s"] * (MAX_STOP_SEQUENCES + 1)}},
        "empty stop sequence": {"json": {**ok, "stop_sequences": [""]}},
        "stop_sequences too long": {"json": {**ok, "stop_sequences": ["x" * (MAX_STOP_BYTES + 1)]}},
        "unknown model": {"json": {**ok, "model": "no-such-model"}},
        "prompt over the context": {"json": {**ok, "messages": [{"role": "user", "content": "river stone " * 3000}]}},
        "chat template refuses": {
            "json": {**ok, "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
        },
        **{f"unsupported {name}": {"json": {**ok, name: {"not": "default"}}} for name in UNSUPPORTED_MESSAGES_FIELDS},
    }
    return {name: {"method": "POST", "url": "/v1/messages", **kw} for name, kw in requests.items()} | {
        "count_tokens of no messages": {
            "method": "POST",
            "url": "/v1/messages/count_tokens",
            "json": {"model": model, "messages": []},
        },
        "count_tokens of an image": {"method": "POST", "url": "/v1/messages/count_tokens", "json": user(image)},
        "wrong method": {"method": "GET", "url": "/v1/messages"},
        "unknown sub-route": {"method": "POST", "url": "/v1/messages/batches", "json": ok},
    }


ANTHROPIC_HOSTILE = sorted(anthropic_hostile_requests("m"))


@pytest.mark.parametrize("name", ANTHROPIC_HOSTILE)
def test_hostile_input_to_messages_is_a_4xx_anthropic_error_and_the_cluster_answers_the_next_request_unchanged(
    cluster: Cluster, model: str, reference: str, name: str
) -> None:
    pids = cluster.runner_pids()
    with cluster.http() as http:
        response = http.request(**anthropic_hostile_requests(model)[name])
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["message"]
    expected = {404: "not_found_error", 413: "request_too_large"}.get(response.status_code, "invalid_request_error")
    assert body["error"]["type"] == expected
    if name == "chat template refuses":
        assert REFUSAL in body["error"]["message"]
    assert ordinary_answer(cluster, model) == reference
    assert cluster.runner_pids() == pids  # no runner crashed, no instance was retired and replaced


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_is_a_4xx_openai_error_and_the_cluster_answers_the_next_request_unchanged(
    cluster: Cluster, model: str, reference: str, name: str
) -> None:
    pids = cluster.runner_pids()
    with cluster.http() as http:
        response = http.request(**hostile_requests(model)[name])
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    if name == "chat template refuses":
        assert REFUSAL in error["message"]
    assert ordinary_answer(cluster, model) == reference
    assert cluster.runner_pids() == pids  # no runner crashed, no instance was retired and replaced


MODEL_IN_BODY = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens")
SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzzing_the_openapi_document_finds_no_5xx_and_no_schema_mismatch(
    cluster: Cluster, model: str, mode: GenerationMode
) -> None:
    """Valid requests (positive) and requests that break the schema (negative), for every operation."""
    schema = schemathesis.openapi.from_url(f"{cluster.base_url}/openapi.json")
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # the document itself does not hold together
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            continue  # a string in a path or query cannot be made other than a string: only bodies break
        if mode is GenerationMode.POSITIVE and operation.path.startswith("/v1/admin/"):
            continue  # a valid load or unload changes what the cluster serves: only broken bodies here

        @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis.settings(
            max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=SLOW_IS_FINE
        )
        def call(case: schemathesis.Case) -> None:
            if case.path in MODEL_IN_BODY and isinstance(case.body, dict):
                case.body["model"] = model  # otherwise nearly every request is an unknown model's 404
            case.call_and_validate(base_url=cluster.base_url, timeout=60, checks=CHECKS)

        call()


def test_after_the_fuzzing_the_cluster_still_answers_unchanged(cluster: Cluster, model: str, reference: str) -> None:
    assert ordinary_answer(cluster, model) == reference
    with httpx.Client(base_url=cluster.base_url) as http:
        assert http.get("/healthz").json()["status"] == "ok"
