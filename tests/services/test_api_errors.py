"""The API app on a real nats-server, through httpx's ASGI transport: every refusal is an OpenAI
error object with a 4xx (or a 503 when the log refuses the write), decided before anything is
published, and a chat template's refusal or a prompt over the model's context never reaches a
runner. (The same inputs against a live `shoal up`: tests/e2e/test_hostile_input.py.)"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import nats
import nats.js.api
import pytest

from eventlog.log import EventLog
from events.subjects import EVENTS_STREAM
from services.api import chat as chat_route
from services.api.app import build_app
from services.api.auth import ApiAccess
from services.api.context import ApiContext
from services.config import ResolvedConfig, ShoalConfig
from tests.events.builders import Events
from tests.services.strict_model import REFUSAL, strict_tiny_model

pytestmark = pytest.mark.timeout(90)
Api = Callable[..., AbstractAsyncContextManager[tuple[ApiContext, httpx.AsyncClient]]]


@pytest.fixture
def api(event_log: EventLog) -> Api:
    @asynccontextmanager
    async def running(served: str = "tiny", **settings: Any) -> AsyncIterator[tuple[ApiContext, httpx.AsyncClient]]:
        await event_log.append(Events().node("n1"))
        resolved = ResolvedConfig(config=ShoalConfig(**settings), sources={}, yaml_path=None)
        ctx = ApiContext.on(event_log, resolved, [served], access=ApiAccess())
        async with anyio.create_task_group() as group:
            group.start_soon(ctx.hub.run)
            await ctx.hub.caught_up.wait()
            transport = httpx.ASGITransport(app=build_app(ctx))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                yield ctx, client
            group.cancel_scope.cancel()

    return running


@pytest.fixture(scope="module")
def strict_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return strict_tiny_model(tmp_path_factory.mktemp("models") / "strict")


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def chat(model: str, *messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": r, "content": c} for r, c in messages], "max_tokens": 4, **extra}


async def test_an_unknown_route_or_method_is_an_openai_error(api: Api) -> None:
    async with api() as (_ctx, client):
        assert openai_error(await client.get("/v2/nothing"), 404)["code"] == "not_found"
        assert openai_error(await client.delete("/v1/models"), 405)["code"] == "method_not_allowed"


async def test_a_bug_in_a_route_is_a_500_openai_error_counted_like_any_answer(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answered by the route's own wrapper, not by the server's outermost layer (which re-raises,
    so uvicorn closes the connection: a client reusing it met a reset)."""

    async def broken(request: object, ctx: object) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr(chat_route, "chat_completions", broken)
    async with api() as (ctx, client):
        response = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": []})
        error = openai_error(response, 500)
        assert error["code"] == "internal_error" and "ValueError" in error["message"]
        assert ctx.metrics.requests[("chat", 500)] == 1


@pytest.mark.parametrize("task_id", ["a.b", "a b", "*", ">", "x" * 129, "task\u00e9"])
async def test_a_task_id_that_is_no_subject_token_is_a_400_and_nothing_is_published(
    api: Api, event_log: EventLog, task_id: str
) -> None:
    async with api() as (_ctx, client):
        before = await event_log.last_seq()
        assert openai_error(await client.get(f"/v1/tasks/{task_id}"), 400)["param"] == "task_id"
        assert openai_error(await client.post(f"/v1/tasks/{task_id}/cancel"), 400)["param"] == "task_id"
        assert await event_log.last_seq() == before


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("content", "headers", "status"),
    [
        (b"model=tiny&messages=hi", {"content-type": "application/x-www-form-urlencoded"}, 415),
        (b'{"model": "tiny", "messages": []}', JSON, 400),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}',
            JSON,
            400,
        ),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 50_000, JSON, 400),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', JSON, 400),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}',
            JSON,
            400,
        ),
    ],
)
async def test_a_malformed_body_is_a_4xx_and_nothing_is_published(
    api: Api, event_log: EventLog, content: bytes, headers: dict[str, str], status: int
) -> None:
    async with api() as (_ctx, client):
        before = await event_log.last_seq()
        openai_error(await client.post("/v1/chat/completions", content=content, headers=headers), status)
        assert await event_log.last_seq() == before


async def test_a_chat_template_that_refuses_the_messages_is_a_400_naming_the_problem(
    api: Api, event_log: EventLog, strict_model: Path
) -> None:
    model = str(strict_model)
    async with api(model) as (_ctx, client):
        before = await event_log.last_seq()
        response = await client.post("/v1/chat/completions", json=chat(model, ("user", "hi"), ("user", "again")))
        error = openai_error(response, 400)
        assert REFUSAL in error["message"] and error["code"] == "chat_template_refused"
        assert await event_log.last_seq() == before


@pytest.mark.parametrize(
    ("url", "body", "param", "code", "says"),
    [
        (
            "/v1/chat/completions",
            lambda model: chat(model, ("user", "river stone " * 3000)),
            "messages",
            "context_length_exceeded",
            "4096",
        ),
        # the tiny tokenizer adds no BOS: `"prompt": ""` leaves a runner no token to start from
        (
            "/v1/completions",
            lambda model: {"model": model, "prompt": "", "max_tokens": 2},
            "prompt",
            "invalid_request",
            "empty",
        ),
    ],
    ids=["over the context", "empty once tokenized"],
)
async def test_a_prompt_of_a_size_no_runner_takes_is_a_400_and_nothing_is_published(
    api: Api,
    event_log: EventLog,
    strict_model: Path,
    url: str,
    body: Callable[[str], dict[str, Any]],
    param: str,
    code: str,
    says: str,
) -> None:
    model = str(strict_model)
    async with api(model) as (_ctx, client):
        before = await event_log.last_seq()
        error = openai_error(await client.post(url, json=body(model)), 400)
        assert (error["param"], error["code"]) == (param, code) and says in error["message"], error
        assert await event_log.last_seq() == before


async def test_stop_strings_count_against_the_prompt_limit(api: Api, strict_model: Path) -> None:
    model = str(strict_model)
    async with api(model, max_prompt_tokens=64) as (_ctx, client):
        response = await client.post("/v1/chat/completions", json=chat(model, ("user", "hi"), stop=["river " * 150]))
        assert "stop strings" in openai_error(response, 413)["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_write_jetstream_refuses_is_a_503_naming_the_cause(api: Api, nats_url: str, stream: bool) -> None:
    async with api() as (ctx, client):
        await _refuse_new_events(nats_url)
        response = await client.post("/v1/chat/completions", json=chat("tiny", ("user", "hi"), stream=stream))
        error = openai_error(response, 503)
        assert error["code"] == "log_unavailable" and "maximum messages" in error["message"]
        assert not ctx.hub.state.tasks


async def _refuse_new_events(nats_url: str) -> None:
    """Make SHOAL_EVENTS full, as a stream at its limits with `discard: new` (or a full disk) is."""
    connection = await nats.connect(nats_url)
    try:
        jetstream = connection.jetstream()
        info = await jetstream.stream_info(EVENTS_STREAM)
        full = dataclasses.replace(info.config, discard=nats.js.api.DiscardPolicy.NEW, max_msgs=info.state.messages)
        await jetstream.update_stream(full)
    finally:
        await connection.close()
