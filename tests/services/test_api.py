"""The API app on a real nats-server, driven as an ASGI server drives it (no HTTP socket): what a
client that goes away does to its task, and what `/debug/timeline` reads."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.types import Message

from eventlog.log import EventLog
from events.catalogue import TaskCancelled, TaskCompleted, Usage
from events.ids import TaskId
from events.subjects import task_subject
from services.api import chat as chat_route
from services.api import task_stream
from services.api.app import build_app
from services.api.auth import ApiAccess
from services.api.context import ApiContext
from services.api.openai_format import completion_usage
from services.api.timeline import events_since_created
from services.config import ResolvedConfig, ShoalConfig
from tests.events.builders import Events

pytestmark = pytest.mark.timeout(60)
CANCEL_WITHIN_S = 1.0  # a disconnect is a message, not something found by polling


@asynccontextmanager
async def running_api(log: EventLog, config: ShoalConfig | None = None) -> AsyncIterator[tuple[ApiContext, Starlette]]:
    resolved = ResolvedConfig(config=config or ShoalConfig(), sources={}, yaml_path=None)
    ctx = ApiContext.on(log, resolved, ["tiny"], access=ApiAccess())
    async with anyio.create_task_group() as group:
        group.start_soon(ctx.hub.run)
        await ctx.hub.caught_up.wait()
        yield ctx, build_app(ctx)
        group.cancel_scope.cancel()


class Client:
    """One HTTP request as the ASGI server presents it: the body, then nothing until the client
    disconnects. Records what the app sends."""

    def __init__(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        raw = json.dumps(body).encode() if body is not None else b""
        self.scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path.split("?")[0],
            "raw_path": path.encode(),
            "query_string": path.partition("?")[2].encode(),
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        self._pending: list[Message] = [{"type": "http.request", "body": raw, "more_body": False}]
        self._gone = anyio.Event()
        self.sent: list[Message] = []
        self.started = anyio.Event()
        self.done = anyio.Event()
        self.texts: list[str] = []

    async def run(self, app: Starlette) -> None:
        """The whole request, as the server runs it; `done` once the app returned."""
        await app(self.scope, self.receive, self.send)
        self.done.set()

    def disconnect(self) -> None:
        self._gone.set()

    async def receive(self) -> Message:
        if self._pending:
            return self._pending.pop(0)
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.start":
            self.started.set()
        elif message.get("body"):
            self.texts.append(message["body"].decode())

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def task_id(self) -> TaskId:
        return TaskId(dict(self.sent[0]["headers"])[b"x-shoal-task-id"].decode())


def chat(stream: bool) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": stream}


async def first_cancel(log: EventLog, task_id: TaskId) -> TaskCancelled:
    async for _seq, event in log.follow(from_seq=1, subjects=[task_subject(task_id, "cancelled")]):
        assert isinstance(event, TaskCancelled)
        return event
    raise AssertionError("the log closed")


async def test_a_client_that_leaves_mid_stream_gets_its_task_cancelled_at_once(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.placed("i1", nodes=("n1",))])
    async with running_api(event_log) as (ctx, app), anyio.create_task_group() as group:
        client = Client("POST", "/v1/chat/completions", chat(stream=True))
        group.start_soon(app, client.scope, client.receive, client.send)
        await client.started.wait()
        task_id = client.task_id
        await event_log.append_many([ev.assigned(task_id, "i1"), ev.chunk(task_id, text="Once")])
        with anyio.fail_after(10):
            while not any("Once" in text for text in client.texts):
                await anyio.sleep(0.01)

        left_at = time.monotonic()
        client.disconnect()
        with anyio.fail_after(10):
            cancel = await first_cancel(event_log, task_id)
        assert cancel.reason == "client_disconnect"
        assert time.monotonic() - left_at < CANCEL_WITHIN_S
    assert not any(m.get("more_body") is False for m in client.sent)  # the stream never ended normally
    assert ctx.hub._listeners == {}  # pyright: ignore[reportPrivateUsage]  # the listener went with the request


async def test_a_client_that_leaves_a_non_streamed_request_gets_499_and_a_cancel(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append(ev.node("n1"))
    async with running_api(event_log) as (ctx, app):
        client = Client("POST", "/v1/chat/completions", chat(stream=False))
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(app, client.scope, client.receive, client.send)
                while not ctx.hub.state.tasks:  # published: the request now waits for the task's end
                    await anyio.sleep(0.01)
                left_at = time.monotonic()
                client.disconnect()
        assert client.status == 499
        task_id = next(iter(ctx.hub.state.tasks))
        with anyio.fail_after(10):
            cancel = await first_cancel(event_log, task_id)
        assert cancel.reason == "client_disconnect"
        assert time.monotonic() - left_at < CANCEL_WITHIN_S


async def test_a_stream_that_ends_sends_its_end_and_cancels_nothing(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.placed("i1", nodes=("n1",))])
    async with running_api(event_log) as (_ctx, app), anyio.create_task_group() as group:
        client = Client("POST", "/v1/chat/completions", chat(stream=True))
        group.start_soon(client.run, app)
        await client.started.wait()
        task_id = client.task_id
        usage = Usage(prompt_tokens=3, completion_tokens=1)
        await event_log.append_many([ev.assigned(task_id, "i1"), ev.chunk(task_id, text="Once")])
        await event_log.append(
            TaskCompleted(env=ev.task_rank(task_id).stamp(), task_id=task_id, finish_reason="stop", usage=usage)
        )
        with anyio.fail_after(10):
            await client.done.wait()
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert client.texts[-1] == "data: [DONE]\n\n" and any("Once" in text for text in client.texts)
    assert await event_log.get_last(task_subject(task_id, "cancelled")) is None


async def test_the_timeline_page_reads_the_log_from_the_tasks_creation(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append(ev.node("n1"))
    await event_log.append_many([ev.created(f"before-{i}") for i in range(300)])
    await event_log.append_many([ev.created("t1"), ev.chunk("t1", text="x"), ev.created("after")])
    async with running_api(event_log) as (ctx, app):
        with anyio.fail_after(10):
            while "after" not in ctx.hub.state.tasks:
                await anyio.sleep(0.01)
        task = ctx.hub.state.tasks[TaskId("t1")]
        read = await events_since_created(event_log, task)
        assert task.created_seq == 302
        assert [seq for seq, _ in read] == [302, 303, 304]  # not the 301 events before it

        client = Client("GET", "/debug/timeline?task=t1")
        await app(client.scope, client.receive, client.send)
        assert client.status == 200 and "<svg" in "".join(client.texts)


def test_usage_says_how_many_prompt_tokens_the_prefix_cache_served() -> None:
    usage = completion_usage(Usage(prompt_tokens=2096, completion_tokens=16, cached_tokens=2063))
    assert msgspec.to_builtins(usage)["prompt_tokens_details"] == {"cached_tokens": 2063}


async def test_the_timeline_page_of_an_instance_draws_the_tasks_of_its_batch(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.node("n2"), ev.placed("i1")])
    for task_id in ("t1", "t2"):
        await event_log.append_many([ev.created(task_id), ev.assigned(task_id, "i1")])
    for task_id in ("t1", "t2"):
        await event_log.append_many([ev.started(task_id, rank=r) for r in (0, 1)])
    await event_log.append_many([ev.chunk("t1", text="a"), ev.chunk("t2", text="b")])
    async with running_api(event_log) as (ctx, app):
        with anyio.fail_after(10):
            while not ctx.hub.state.tasks.get(TaskId("t2"), None) or not ctx.hub.state.tasks[TaskId("t2")].chunks:
                await anyio.sleep(0.01)
        client = Client("GET", "/debug/timeline?instance=i1")
        await app(client.scope, client.receive, client.send)
        page = "".join(client.texts)
        assert client.status == 200 and page.count('class="task"') == 4  # two tasks on each of two ranks
        assert "at most 2 at once" in page
        missing = Client("GET", "/debug/timeline?instance=i2")
        await app(missing.scope, missing.receive, missing.send)
        assert missing.status == 404 and "nearest: i1" in "".join(missing.texts)


async def test_served_models_tokenizers_are_loaded_before_their_first_request(event_log: EventLog) -> None:
    """A first request would otherwise pay for importing transformers and reading the tokenizer
    (1.5 s against 0.1 s for the next one on a 100M-parameter model)."""
    from runner.models.tiny import cached_tiny

    cached_tiny()  # the directory a runner would have built for `tiny`
    async with running_api(event_log) as (ctx, _app), anyio.create_task_group() as group:
        assert ctx.loaded_prompt_models == ()
        group.start_soon(ctx.preload_prompt_models, 0.05)
        with anyio.fail_after(45):
            while "tiny" not in ctx.loaded_prompt_models:
                await anyio.sleep(0.05)
        prompt_model = await ctx.prompt_model("tiny")
        assert prompt_model is not None and prompt_model.context_length == 4096
        group.cancel_scope.cancel()


async def test_a_bug_mid_stream_ends_the_stream_with_an_error_and_cancels_the_task(
    event_log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the 200 went out a bug can no longer be a status: the client gets it as the stream's
    last event and [DONE] (a cut body left openai-python with a bare protocol error), the task is
    cancelled as the server's doing, and the app returns normally (uvicorn keeps the connection)."""
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.placed("i1", nodes=("n1",))])
    shown = chat_route._ChatShape.chunks  # pyright: ignore[reportPrivateUsage]

    def broken(self: Any, event: Any) -> list[bytes]:
        if getattr(event, "text", None) == "boom":
            raise KeyError("a bug")
        return shown(self, event)

    monkeypatch.setattr(chat_route._ChatShape, "chunks", broken)  # pyright: ignore[reportPrivateUsage]
    async with running_api(event_log) as (ctx, app), anyio.create_task_group() as group:
        client = Client("POST", "/v1/chat/completions", chat(stream=True))
        group.start_soon(client.run, app)
        await client.started.wait()
        task_id = client.task_id
        await event_log.append_many(
            [ev.assigned(task_id, "i1"), ev.chunk(task_id, text="Once"), ev.chunk(task_id, text="boom")]
        )
        with anyio.fail_after(10):
            await client.done.wait()
            cancel = await first_cancel(event_log, task_id)
    assert client.status == 200 and any("Once" in text for text in client.texts)
    error = json.loads(client.texts[-1].split("\n\n")[0].removeprefix("data: "))["error"]
    assert error["code"] == "internal_error" and "KeyError" in error["message"], error
    assert client.texts[-1].endswith("data: [DONE]\n\n")
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert cancel.reason == "server_error"
    assert ctx.hub._listeners == {}  # pyright: ignore[reportPrivateUsage]


async def test_a_bug_while_a_request_waits_for_its_task_is_a_500_naming_it_and_cancels_the_task(
    event_log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev = Events()
    await event_log.append(ev.node("n1"))

    async def broken(events: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(task_stream, "collect", broken)
    async with running_api(event_log) as (ctx, app):
        client = Client("POST", "/v1/chat/completions", chat(stream=False))
        with anyio.fail_after(10):
            await app(client.scope, client.receive, client.send)
            task_id = next(iter(ctx.hub.state.tasks))
            cancel = await first_cancel(event_log, task_id)
    assert client.status == 500
    error = json.loads(client.texts[-1])["error"]
    assert error["code"] == "internal_error" and "KeyError" in error["message"], error  # not the task group's wrapping
    assert cancel.reason == "server_error"
