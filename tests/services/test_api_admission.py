"""Admission and deadlines through the API app on a real nats-server (driven as an ASGI server
drives it): the request beyond `max_queued_tasks` gets a 429 with `Retry-After`, and a task the
master failed at its deadline answers 504 (not streamed) or an error chunk (streamed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette

from eventlog.log import EventLog
from events.catalogue import TaskFailed
from events.ids import TaskId
from services.api.app import build_app
from services.api.auth import ApiAccess, parse_entries
from services.api.context import ApiContext
from services.api.errors import failure_status
from services.config import ResolvedConfig, ShoalConfig
from tests.events.builders import Events
from tests.services.test_api import Client, chat

pytestmark = pytest.mark.timeout(60)
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef01"
DEADLINE_ERROR = "request timed out after 5 s (request_timeout_seconds)"


@asynccontextmanager
async def api_with(
    log: EventLog, config: ShoalConfig, access: ApiAccess | None = None
) -> AsyncIterator[tuple[ApiContext, Starlette]]:
    ctx = ApiContext.on(log, ResolvedConfig(config=config, sources={}), ["tiny"], access=access or ApiAccess())
    async with anyio.create_task_group() as group:
        group.start_soon(ctx.hub.run)
        await ctx.hub.caught_up.wait()
        yield ctx, build_app(ctx)
        group.cancel_scope.cancel()


async def test_the_request_beyond_the_queue_bound_gets_429_saying_how_full_it_is(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append(ev.node("n1"))
    async with api_with(event_log, ShoalConfig(max_queued_tasks=2)) as (ctx, app), anyio.create_task_group() as group:
        waiting = [Client("POST", "/v1/chat/completions", chat(stream=True)) for _ in range(2)]
        for client in waiting:
            group.start_soon(app, client.scope, client.receive, client.send)
        with anyio.fail_after(40):  # the first request loads the tokenizer (transformers: seconds)
            while ctx.hub.queues.queued("tiny") < 2:  # both admitted (published or about to be)
                await anyio.sleep(0.01)
        for stream in (True, False):
            refused = Client("POST", "/v1/chat/completions", chat(stream=stream))
            with anyio.fail_after(10):
                await app(refused.scope, refused.receive, refused.send)
            assert refused.status == 429
            assert dict(refused.sent[0]["headers"])[b"retry-after"] == b"1"
            error = json.loads(refused.texts[0])["error"]
            assert error["code"] == "queue_full"
            assert error["message"] == "model 'tiny' has 2 of 2 queued tasks (max_queued_tasks); retry after 1 s"
        # a request that can never run is told so, not told to retry: its logit_bias is checked first
        hopeless = Client("POST", "/v1/chat/completions", {**chat(stream=False), "logit_bias": {"5000": 1}})
        with anyio.fail_after(10):
            await app(hopeless.scope, hopeless.receive, hopeless.send)
        assert hopeless.status == 400 and "outside the model's vocabulary" in hopeless.texts[0]
        with anyio.fail_after(10):
            while len(ctx.hub.state.tasks) < 2:
                await anyio.sleep(0.01)
        assert len(ctx.hub.state.tasks) == 2  # the refused ones were never published
        for client in waiting:
            client.disconnect()


def keyed(key: str, body: dict[str, Any]) -> Client:
    client = Client("POST", "/v1/chat/completions", body)
    client.scope["headers"].append((b"authorization", f"Bearer {key}".encode()))
    return client


@pytest.mark.parametrize(
    ("config", "share", "said"),
    [
        (ShoalConfig(max_queued_tasks=10, max_queued_tasks_per_key=1), 1, "(max_queued_tasks_per_key)"),
        (ShoalConfig(max_queued_tasks=4), 3, "(the default share: all but the last 1 of max_queued_tasks 4"),
    ],
    ids=["set", "default"],
)
async def test_one_keys_share_of_the_queue_is_bounded_while_another_key_is_still_taken(
    event_log: EventLog, config: ShoalConfig, share: int, said: str
) -> None:
    ev = Events()
    await event_log.append(ev.node("n1"))
    access = ApiAccess(parse_entries([ALICE, BOB]))
    async with api_with(event_log, config, access) as (ctx, app), anyio.create_task_group() as group:

        async def taken(client: Client, queued: int, seconds: float) -> None:
            group.start_soon(app, client.scope, client.receive, client.send)
            with anyio.fail_after(seconds):
                while ctx.hub.queues.queued("tiny") < queued:
                    await anyio.sleep(0.01)

        flood = [keyed(ALICE, chat(stream=True)) for _ in range(share)]
        for count, client in enumerate(flood, start=1):
            await taken(client, count, 40)  # the first request loads the tokenizer (transformers: seconds)
        again = keyed(ALICE, chat(stream=False))
        with anyio.fail_after(10):
            await app(again.scope, again.receive, again.send)
        assert again.status == 429
        message = json.loads(again.texts[0])["error"]["message"]
        assert f"{share} of this API key's {share} queued tasks {said}" in message, message
        other = keyed(BOB, chat(stream=True))
        await taken(other, share + 1, 10)  # bob's was taken
        for client in (*flood, other):
            client.disconnect()


async def _fail_at_deadline(log: EventLog, ctx: ApiContext, ev: Events) -> TaskId:
    with anyio.fail_after(40):  # the first request loads the tokenizer (transformers: seconds)
        while not ctx.hub.state.tasks:
            await anyio.sleep(0.01)
    task_id = next(iter(ctx.hub.state.tasks))
    await log.append(TaskFailed(env=ev.master.stamp(), task_id=task_id, error=DEADLINE_ERROR, deadline=True))
    return task_id


async def test_a_task_failed_at_its_deadline_answers_504_or_an_error_chunk(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append(ev.node("n1"))
    async with api_with(event_log, ShoalConfig(request_timeout_seconds=5)) as (ctx, app):
        plain = Client("POST", "/v1/chat/completions", chat(stream=False))
        task_id = TaskId("")
        async with anyio.create_task_group() as group:
            group.start_soon(app, plain.scope, plain.receive, plain.send)
            task_id = await _fail_at_deadline(event_log, ctx, ev)
        assert plain.status == 504
        assert json.loads(plain.texts[0])["error"] == {
            "message": DEADLINE_ERROR,
            "type": "task_failed",
            "param": None,
            "code": "request_timeout",
        }
        assert ctx.hub.state.tasks[task_id].status == "failed"

    async with api_with(event_log, ShoalConfig(request_timeout_seconds=5)) as (ctx, app):
        streamed = Client("POST", "/v1/chat/completions", chat(stream=True))
        async with anyio.create_task_group() as group:
            group.start_soon(app, streamed.scope, streamed.receive, streamed.send)
            await streamed.started.wait()
            with anyio.fail_after(10):
                while streamed.task_id not in ctx.hub.state.tasks:
                    await anyio.sleep(0.01)
            await event_log.append(
                TaskFailed(env=ev.master.stamp(), task_id=streamed.task_id, error=DEADLINE_ERROR, deadline=True)
            )
        error_chunk = next(text for text in streamed.texts if "error" in text)
        assert json.loads(error_chunk.removeprefix("data: ").split("\n")[0])["error"]["code"] == "request_timeout"
        assert streamed.texts[-1].endswith("data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("deadline", "invalid_request", "expected"),
    [
        (True, False, (504, "task_failed", "request_timeout")),
        (False, True, (400, "invalid_request_error", "invalid_request")),  # refused by the runners: not retried
        (False, False, (500, "task_failed", "task_failed")),
    ],
)
def test_a_failed_task_answers_the_status_its_cause_deserves(
    deadline: bool, invalid_request: bool, expected: tuple[int, str, str]
) -> None:
    failed = TaskFailed(
        env=Events().master.stamp(), task_id=TaskId("t"), error="x", deadline=deadline, invalid_request=invalid_request
    )
    assert failure_status(failed) == expected
