"""GET /debug/timeline?task=ID: the task as a waterfall, with its diagnosis, from the live log.

The page is built by the operators' tools (`services.ops`) from the whole log — both streams —
exactly as `shoal replay --html` builds it from an export, so the two can never disagree.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from events.catalogue import AnyEvent
from events.ids import TaskId
from services.api.context import ApiContext
from services.api.schemas import RequestProblem
from services.ops.nearest import unknown_id_message
from services.ops.offline import timeline_and_findings
from services.ops.render_html import render_timeline_html


async def timeline_page(request: Request, ctx: ApiContext) -> Response:
    task_id = request.query_params.get("task", "")
    if not task_id:
        raise RequestProblem(400, "give the task to draw: /debug/timeline?task=<task id>", param="task")
    task = ctx.hub.state.tasks.get(TaskId(task_id))
    if task is None:
        raise RequestProblem(
            404, unknown_id_message("task", task_id, ctx.hub.state.tasks.keys()), code="task_not_found"
        )
    events: list[tuple[int, AnyEvent]] = [pair async for pair in ctx.log.replay()]
    since = datetime.fromtimestamp(task.created_at / 1e9, tz=UTC)
    events += [pair async for pair in ctx.log.replay(from_time=since, stream="telemetry")]
    timeline, findings = timeline_and_findings(task_id, events, now_ns=time.time_ns())
    return HTMLResponse(render_timeline_html(timeline, findings))
