"""`GET /v1/tasks/{id}` of a task evicted from the API's State (`events.retention`) reads it back
from the log, as it was before eviction; an unknown id is still a 404."""

from __future__ import annotations

import json

import anyio
import msgspec
import pytest

from eventlog.log import EventLog
from events.catalogue import TaskCompleted, Usage
from events.ids import TaskId
from services.api.app import build_app
from services.api.auth import ApiAccess
from services.api.context import ApiContext
from services.config import ResolvedConfig, ShoalConfig
from tests.events.builders import Events
from tests.services.test_api import Client

pytestmark = pytest.mark.timeout(60)
KEPT = 2


async def test_an_evicted_task_is_read_back_from_the_log(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.placed("i1", nodes=("n1",))])
    for number in range(5):  # t0 .. t4 end in order: only the newest KEPT stay whole in the State
        task_id = f"t{number}"
        usage = Usage(prompt_tokens=3, completion_tokens=2)
        done = TaskCompleted(
            env=ev.task_rank(task_id).stamp(), task_id=TaskId(task_id), finish_reason="stop", usage=usage
        )
        await event_log.append_many(
            [ev.created(task_id), ev.assigned(task_id), ev.chunk(task_id, text=f"answer {number}"), done]
        )
    config = ShoalConfig(finished_tasks_kept=KEPT)
    ctx = ApiContext.on(
        event_log, ResolvedConfig(config=config, sources={}, yaml_path=None), ["tiny"], access=ApiAccess()
    )
    app = build_app(ctx)
    async with anyio.create_task_group() as group:
        group.start_soon(ctx.hub.run)
        with anyio.fail_after(10):
            await ctx.hub.caught_up.wait()
        assert sorted(ctx.hub.state.tasks) == ["t3", "t4"]

        client = Client("GET", "/v1/tasks/t0")
        await app(client.scope, client.receive, client.send)
        assert client.status == 200
        body = json.loads("".join(client.texts))
        assert (body["task_id"], body["status"], body["text"]) == ("t0", "completed", "answer 0")
        assert body["created_seq"] == 3 and body["ended_seq"] == 6  # the seqs of the log, as when held
        unbounded = await event_log.fold(finished_tasks_kept=0)
        assert body == json.loads(msgspec.json.encode(unbounded.tasks[TaskId("t0")]))  # exactly as it was

        missing = Client("GET", "/v1/tasks/never-created")
        await app(missing.scope, missing.receive, missing.send)
        assert missing.status == 404
        group.cancel_scope.cancel()
