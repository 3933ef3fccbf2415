"""The dashboard's summary and deltas: a page that merges every delta into its snapshot shows what
a fresh snapshot would (folded over random task lifecycles), and the SSE feed sends exactly that."""

from __future__ import annotations

import json
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.log import EventLog
from events.catalogue import LogEvent, TaskCancelled, TaskCompleted, TaskFailed, TaskStalled, Usage
from events.fold import apply_live
from events.ids import TaskId
from events.state import State
from services.api.app import build_app
from services.api.auth import ApiAccess, parse_entries
from services.api.context import ApiContext
from services.api.dashboard import RECENT_ENDED, Delta, Summary, deltas, snapshot
from services.config import ResolvedConfig, ShoalConfig
from tests.events.builders import Events
from tests.services.test_api import Client, running_api

TASKS = ("t1", "t2", "t3")


def lifecycle_event(ev: Events, action: str, task: str, rank: int) -> LogEvent:
    """One step a task, an instance or a node can take (some out of order: the fold refuses those)."""
    tid = TaskId(task)
    return {
        "node": lambda: ev.node(f"n{rank + 1}"),
        "placed": lambda: ev.placed("i1", ("n1", "n2")),
        "ready": lambda: ev.runner(rank, "ready"),
        "runner_failed": lambda: ev.runner(rank, "failed"),
        "created": lambda: ev.created(task),
        "assigned": lambda: ev.assigned(task),
        "started": lambda: ev.started(task, rank),
        "progress": lambda: ev.progress(task, rank, processed=128 * (rank + 1), iteration=rank + 1),
        "chunk": lambda: ev.chunk(task),
        "stalled": lambda: TaskStalled(
            env=ev.master.stamp(), task_id=tid, diagnosis="rank 1 (running): prefill iteration 2"
        ),
        "completed": lambda: TaskCompleted(
            env=ev.task_rank(task).stamp(), task_id=tid, finish_reason="stop", usage=Usage()
        ),
        "failed": lambda: TaskFailed(env=ev.master.stamp(), task_id=tid, error="stalled: no progress", rank=1),
        "cancelled": lambda: TaskCancelled(env=ev.api.stamp(), task_id=tid, reason="api"),
    }[action]()


CLUSTER_STEPS = ("node", "placed", "ready", "runner_failed")
TASK_STEPS = ("created", "assigned", "started", "progress", "chunk", "stalled", "completed", "failed", "cancelled")
ACTIONS = st.sampled_from((*CLUSTER_STEPS, *TASK_STEPS))
STEPS = st.lists(st.tuples(ACTIONS, st.sampled_from(TASKS), st.integers(0, 1)), max_size=60)


def merged(page: Summary, delta: Delta) -> Summary:
    """What the page does with a delta: replace each row by its id."""

    def upsert(rows: tuple[Any, ...], new: tuple[Any, ...], key: str) -> tuple[Any, ...]:
        by_id = {getattr(row, key): row for row in rows} | {getattr(row, key): row for row in new}
        return tuple(by_id.values())

    return Summary(
        last_seq=delta.seq,
        nodes=upsert(page.nodes, delta.nodes, "node_id"),
        instances=upsert(page.instances, delta.instances, "instance_id"),
        tasks=upsert(page.tasks, delta.tasks, "task_id"),
    )


def as_sets(summary: Summary) -> tuple[int, set[Any], set[Any], set[Any]]:
    return summary.last_seq, set(summary.nodes), set(summary.instances), set(summary.tasks)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_a_page_that_merges_every_delta_shows_a_fresh_snapshot(steps: list[tuple[str, str, int]]) -> None:
    ev = Events()
    state = State()
    page = snapshot(state, recent_ended=None)
    setup = [("node", "t1", 0), ("node", "t1", 1), ("placed", "t1", 0)]  # so that most steps apply
    for seq, (action, task, rank) in enumerate(setup + steps, start=1):
        before = state
        event = lifecycle_event(ev, action, task, rank)
        state, _error = apply_live(state, seq, event)
        delta = deltas(before, state, event)
        if delta is not None:
            page = merged(page, delta)
        assert as_sets(page)[1:] == as_sets(snapshot(state, recent_ended=None))[1:]


def test_a_task_mid_prefill_shows_each_ranks_progress_and_its_stall() -> None:
    ev = Events()
    events: list[LogEvent] = [ev.node("n1"), ev.node("n2"), ev.placed("i1", ("n1", "n2")), ev.created("t1")]
    events += [ev.assigned("t1"), ev.started("t1", 0), ev.started("t1", 1), ev.progress("t1", 0, processed=256)]
    events.append(TaskStalled(env=ev.master.stamp(), task_id=TaskId("t1"), diagnosis="rank 1: prefill iteration 2"))
    state = State()
    for seq, event in enumerate(events, start=1):
        state, error = apply_live(state, seq, event)
        assert error is None
    summary = snapshot(state)
    (task,) = summary.tasks
    assert [(r.rank, r.processed, r.total) for r in task.ranks] == [(0, 256, 512), (1, 0, 512)]
    assert task.status == "prefilling" and task.stalled == "rank 1: prefill iteration 2"
    (instance,) = summary.instances
    assert [(s.rank, s.node_id, s.start_layer, s.end_layer) for s in instance.shards] == [
        (0, "n1", 0, 4),
        (1, "n2", 4, 8),
    ]
    assert instance.queue == ("t1",)


def test_the_snapshot_keeps_running_tasks_and_the_newest_ended_ones() -> None:
    ev = Events()
    state = State()
    events: list[LogEvent] = [ev.created("running")]
    for i in range(RECENT_ENDED + 5):
        ended = TaskFailed(env=ev.master.stamp(), task_id=TaskId(f"done-{i}"), error="boom")
        events += [ev.created(f"done-{i}"), ended]
    for seq, event in enumerate(events, start=1):
        state, _error = apply_live(state, seq, event)
    shown = [task.task_id for task in snapshot(state).tasks]
    assert shown[0] == "running" and len(shown) == 1 + RECENT_ENDED
    assert shown[1] == f"done-{RECENT_ENDED + 4}" and "done-4" not in shown


def sse_events(texts: list[str]) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for block in "".join(texts).split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "data" in lines:
            found.append((lines["event"], json.loads(lines["data"])))
    return found


@pytest.mark.timeout(60)
async def test_the_feed_sends_a_snapshot_then_the_deltas_of_what_is_folded(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.node("n2"), ev.placed("i1", ("n1", "n2"))])
    page = Client("GET", "/v1/dashboard/events")
    async with running_api(event_log) as (ctx, app), anyio.create_task_group() as group:
        with anyio.fail_after(10):
            while "i1" not in ctx.hub.state.instances:
                await anyio.sleep(0.01)
        group.start_soon(app, page.scope, page.receive, page.send)
        await page.started.wait()
        await event_log.append_many([ev.created("t1"), ev.assigned("t1"), ev.started("t1", 1)])
        await event_log.append(ev.progress("t1", 1, processed=384, iteration=3))
        with anyio.fail_after(10):
            while not any('"processed":384' in text for text in page.texts):
                await anyio.sleep(0.01)
        page.disconnect()
    received = sse_events(page.texts)
    kind, first = received[0]
    assert kind == "snapshot" and [n["node_id"] for n in first["nodes"]] == ["n1", "n2"] and first["tasks"] == []
    assert all(kind == "delta" for kind, _ in received[1:])
    seqs = [body["seq"] for _, body in received[1:]]
    assert seqs == sorted(seqs) and seqs[0] == first["last_seq"] + 1
    task = msgspec.convert(received[-1][1], Delta).tasks[0]
    assert (task.task_id, task.status, task.ranks[0].processed, task.ranks[0].total) == ("t1", "prefilling", 384, 512)
    assert received[2][1]["instances"][0]["queue"] == ["t1"]  # the assignment moved the instance's queue


async def test_with_keys_the_page_is_open_and_its_feed_needs_an_admin_key(event_log: EventLog) -> None:
    resolved = ResolvedConfig(config=ShoalConfig(), sources={}, yaml_path=None)
    access = ApiAccess(parse_entries(["user-key", "boss-key:admin"]))
    app = build_app(ApiContext.on(event_log, resolved, ["tiny"], access=access))
    answers: dict[str, int] = {}
    for name, path, key in [
        ("page", "/", None),
        ("script", "/static/dashboard.js", None),
        ("unknown file", "/static/secrets.txt", None),
        ("feed without a key", "/v1/dashboard/events", None),
        ("feed with a user key", "/v1/dashboard/events", "user-key"),
    ]:
        request = Client("GET", path)
        if key is not None:
            request.scope["headers"].append((b"authorization", f"Bearer {key}".encode()))
        await app(request.scope, request.receive, request.send)
        answers[name] = request.status
    assert answers == {
        "page": 200,
        "script": 200,
        "unknown file": 404,
        "feed without a key": 401,
        "feed with a user key": 403,
    }
