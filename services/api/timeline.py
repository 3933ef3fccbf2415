"""GET /debug/timeline?task=ID: the task as a waterfall, with its diagnosis, from the live log;
GET /debug/timeline?instance=ID: the instance, one lane per rank with the tasks it ran (batches).

The page is drawn by the operators' tools (`services.ops`), as `shoal replay --html` draws it
from an export. It reads only what the task can appear in: the events from the task's own
creation (`TaskInfo.created_seq`) and the telemetry since then; the diagnosis takes the rest
(instances, nodes) from the State the API already follows, so no request replays the whole log.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from eventlog.log import EventLog
from events.catalogue import AnyEvent
from events.ids import InstanceId, TaskId
from events.state import TaskInfo
from services.api.context import ApiContext
from services.api.schemas import RequestProblem
from services.ops.nearest import unknown_id_message
from services.ops.offline import instance_timeline_and_findings, timeline_and_findings
from services.ops.render_html import render_timeline_html
from services.ops.render_instance import render_instance_html
from services.ops.task_history import task_from_log

INSTANCE_WINDOW_S = 600  # how much of an instance's history its page draws


async def timeline_page(request: Request, ctx: ApiContext) -> Response:
    instance_id = request.query_params.get("instance", "")
    if instance_id:
        return await _instance_page(ctx, instance_id)
    task_id = request.query_params.get("task", "")
    if not task_id:
        raise RequestProblem(
            400, "give the task or the instance to draw: /debug/timeline?task=<task id> or ?instance=<id>", param="task"
        )
    task = ctx.hub.state.tasks.get(TaskId(task_id))
    if task is None:  # an older ended task: the log still has it
        task = await task_from_log(ctx.log, TaskId(task_id), ctx.hub.state)
    if task is None:
        raise RequestProblem(
            404, unknown_id_message("task", task_id, ctx.hub.state.tasks.keys()), code="task_not_found"
        )
    events = await events_since_created(ctx.log, task)
    timeline, findings = timeline_and_findings(task_id, ctx.hub.state, events, now_ns=time.time_ns())
    return HTMLResponse(render_timeline_html(timeline, findings))


async def _instance_page(ctx: ApiContext, instance_id: str) -> Response:
    """The instance's last `INSTANCE_WINDOW_S` (a long-lived instance's whole history would be
    the whole log), both streams; tasks assigned before the window are known from the State."""
    instance = ctx.hub.state.instances.get(InstanceId(instance_id))
    if instance is None:
        known = ctx.hub.state.instances.keys()
        raise RequestProblem(404, unknown_id_message("instance", instance_id, known), code="instance_not_found")
    now_ns = time.time_ns()
    since = datetime.fromtimestamp(max(instance.placed_at, now_ns - INSTANCE_WINDOW_S * 10**9) / 1e9, tz=UTC)
    events: list[tuple[int, AnyEvent]] = [pair async for pair in ctx.log.replay(from_time=since)]
    events += [pair async for pair in ctx.log.replay(from_time=since, stream="telemetry")]
    timeline, findings = instance_timeline_and_findings(instance_id, ctx.hub.state, events, now_ns=now_ns)
    return HTMLResponse(render_instance_html(timeline, findings))


async def events_since_created(log: EventLog, task: TaskInfo) -> list[tuple[int, AnyEvent]]:
    """Both streams from the task's creation on: every event the task's timeline can use."""
    events: list[tuple[int, AnyEvent]] = [pair async for pair in log.replay(from_seq=task.created_seq)]
    since = datetime.fromtimestamp(task.created_at / 1e9, tz=UTC)
    events += [pair async for pair in log.replay(from_time=since, stream="telemetry")]
    return events
