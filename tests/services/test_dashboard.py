"""The dashboard's summary and deltas: a page that merges every delta into its snapshot shows what
a fresh snapshot would (folded over random task, instance, node and model lifecycles), and the SSE
feed sends exactly that; what the rows say of memory, draining, the batch and the queue; the live
token rates and what a chunk costs the fold's dashboard work."""

from __future__ import annotations

import json
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.log import EventLog
from events.catalogue import (
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    ModelLoadRequested,
    ModelUnloadRequested,
    NodeLeft,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
    Usage,
)
from events.fold import apply_live
from events.ids import InstanceId, NodeId, TaskId
from events.state import State
from services.api.app import build_app
from services.api.auth import ApiAccess, parse_entries
from services.api.context import ApiContext
from services.api.dashboard import RECENT_ENDED, Delta, Summary, deltas, snapshot
from services.config import ResolvedConfig, ShoalConfig
from tests.events.builders import Events
from tests.services.test_api import Client, running_api

TASKS = ("t1", "t2", "t3")
GIB = 1 << 30
OTHER = "other"  # a second model, placed on one node


def with_memory(placed: InstancePlaced, model: str, gib_per_rank: float) -> InstancePlaced:
    """A placement as the master makes it now: of `model`, each rank reserving memory on its node."""
    shards = [msgspec.structs.replace(s, memory_bytes=int(gib_per_rank * GIB)) for s in placed.shards]
    return msgspec.structs.replace(placed, model=model, shards=shards, reason=f"{model}: the fewest nodes that hold it")


def for_model(created: TaskCreated, model: str) -> TaskCreated:
    return msgspec.structs.replace(created, model=model)


def lifecycle_event(ev: Events, action: str, task: str, rank: int) -> LogEvent:
    """One step a task, an instance or a node can take (some out of order: the fold refuses those)."""
    tid = TaskId(task)
    return {
        "node": lambda: ev.node(f"n{rank + 1}", memory_gb=4),
        "node_left": lambda: NodeLeft(
            env=ev.worker(f"n{rank + 1}").stamp(), node_id=NodeId(f"n{rank + 1}"), reason="stop"
        ),
        "placed": lambda: with_memory(ev.placed("i1", ("n1", "n2")), "tiny", 1.5),
        "placed_other": lambda: with_memory(ev.placed("i2", ("n2",), layers=4), OTHER, 2),
        "ready": lambda: ev.runner(rank, "ready"),
        "other_ready": lambda: ev.runner(0, "ready", "i2"),
        "runner_failed": lambda: ev.runner(rank, "failed"),
        "retired": lambda: InstanceRetired(
            env=ev.master.stamp(), instance_id=InstanceId(f"i{rank + 1}"), reason="idle"
        ),
        "unload": lambda: ModelUnloadRequested(env=ev.api.stamp(), model=("tiny", OTHER)[rank]),
        "load": lambda: ModelLoadRequested(env=ev.api.stamp(), model=("tiny", OTHER)[rank], pinned=True),
        "created": lambda: ev.created(task),
        "created_elsewhere": lambda: for_model(ev.created(task), f"hub/{task}"),
        "assigned": lambda: ev.assigned(task),
        "assigned_other": lambda: ev.assigned(task, "i2"),
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


CLUSTER_STEPS = ("node", "node_left", "placed", "placed_other", "ready", "other_ready", "runner_failed", "retired")
MODEL_STEPS = ("unload", "load")
TASK_STEPS = (
    "created",
    "created_elsewhere",
    "assigned",
    "assigned_other",
    "started",
    "progress",
    "chunk",
    "stalled",
    "completed",
    "failed",
    "cancelled",
)
ACTIONS = st.sampled_from((*CLUSTER_STEPS, *MODEL_STEPS, *TASK_STEPS))
STEPS = st.lists(st.tuples(ACTIONS, st.sampled_from(TASKS), st.integers(0, 1)), max_size=60)


def merged(page: Summary, delta: Delta) -> Summary:
    """What the page does with a delta: replace each row by its id."""

    def upsert(rows: tuple[Any, ...], new: tuple[Any, ...], key: str, gone: tuple[str, ...] = ()) -> tuple[Any, ...]:
        by_id = {getattr(row, key): row for row in rows} | {getattr(row, key): row for row in new}
        return tuple(row for name, row in by_id.items() if name not in gone)

    return Summary(
        last_seq=delta.seq,
        nodes=upsert(page.nodes, delta.nodes, "node_id"),
        models=upsert(page.models, delta.models, "model", delta.gone_models),
        instances=upsert(page.instances, delta.instances, "instance_id"),
        tasks=upsert(page.tasks, delta.tasks, "task_id"),
    )


def as_sets(summary: Summary) -> tuple[int, set[Any], set[Any], set[Any], set[Any]]:
    return summary.last_seq, set(summary.nodes), set(summary.models), set(summary.instances), set(summary.tasks)


PLACED = [("node", "t1", 0), ("node", "t1", 1), ("placed", "t1", 0)]  # so that most steps apply
# ... and so that a task is in a ready instance's batch from the start (random steps seldom get there)
SERVING = [*PLACED, ("ready", "t1", 0), ("ready", "t1", 1), ("created", "t1", 0), ("assigned", "t1", 0)]
SERVING += [("started", "t1", 0), ("created", "t2", 0), ("assigned", "t2", 0)]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([PLACED, SERVING]), STEPS)
def test_a_page_that_merges_every_delta_shows_a_fresh_snapshot(
    setup: list[tuple[str, str, int]], steps: list[tuple[str, str, int]]
) -> None:
    ev = Events()
    state = State()
    configured = ("tiny",)
    page = snapshot(state, configured, recent_ended=None)
    for seq, (action, task, rank) in enumerate(setup + steps, start=1):
        before = state
        event = lifecycle_event(ev, action, task, rank)
        state, _error = apply_live(state, seq, event)
        delta = deltas(before, state, event, configured)
        if delta is not None:
            page = merged(page, delta)
        assert as_sets(page)[1:] == as_sets(snapshot(state, configured, recent_ended=None))[1:], (action, task)


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
    assert instance.running == ("t1",) and instance.queued == ()


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
async def test_the_feed_sends_a_snapshot_then_the_deltas_of_what_is_folded_and_the_rates(event_log: EventLog) -> None:
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
        await event_log.append(ev.chunk("t1", tokens=5))  # 5 tokens in the 5 s window: 1 token/s
        with anyio.fail_after(10):
            while not any('{"tokens_per_second":{"i1":1.0}}' in text for text in page.texts):
                await anyio.sleep(0.01)
        page.disconnect()
    received = sse_events(page.texts)
    kind, first = received[0]
    assert kind == "snapshot" and [n["node_id"] for n in first["nodes"]] == ["n1", "n2"] and first["tasks"] == []
    assert [m["model"] for m in first["models"]] == ["tiny"] and first["models"][0]["state"] == "loading"
    assert received[1] == ("rates", {"tokens_per_second": {}})  # no instance generates yet
    assert all(kind in ("delta", "rates") for kind, _ in received[2:])
    changes = [body for kind, body in received[2:] if kind == "delta"]
    seqs = [body["seq"] for body in changes]
    assert seqs == sorted(seqs) and seqs[0] == first["last_seq"] + 1
    task = msgspec.convert(changes[-2], Delta).tasks[0]
    assert (task.task_id, task.status, task.ranks[0].processed, task.ranks[0].total) == ("t1", "prefilling", 384, 512)
    assert msgspec.convert(changes[-1], Delta).tasks[0].completion_tokens == 5
    # the assignment queued it on its instance, and its prefill put it in the instance's batch
    assert [(c["instances"][0]["queued"], c["instances"][0]["running"]) for c in changes[1:3]] == [
        (["t1"], []),
        ([], ["t1"]),
    ]


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


def folded(events: list[LogEvent], configured: tuple[str, ...] = ("tiny",)) -> tuple[State, list[Delta | None]]:
    """The State after `events`, and each event's delta."""
    state, changes = State(), []
    for seq, event in enumerate(events, start=1):
        before = state
        state, error = apply_live(state, seq, event)
        assert error is None, error
        changes.append(deltas(before, state, event, configured))
    return state, changes


def test_nodes_show_the_memory_live_instances_reserve_on_them_and_on_their_host() -> None:
    ev = Events()
    on_host = [msgspec.structs.replace(ev.node(n, memory_gb=4), host_memory_bytes=10 * GIB) for n in ("n1", "n2")]
    tiny = with_memory(ev.placed("i1", ("n1", "n2")), "tiny", 1.5)
    other = with_memory(ev.placed("i2", ("n2",), layers=4), OTHER, 2)
    state, _ = folded([*on_host, tiny, other])
    memory = {
        n.node_id: (n.memory_bytes, n.reserved_bytes, n.host_memory_bytes, n.host_reserved_bytes)
        for n in snapshot(state).nodes
    }
    assert memory == {"n1": (4 * GIB, 1.5 * GIB, 10 * GIB, 5 * GIB), "n2": (4 * GIB, 3.5 * GIB, 10 * GIB, 5 * GIB)}

    retired = InstanceRetired(env=ev.master.stamp(), instance_id=InstanceId("i2"), reason="idle", cause="idle")
    after, changes = folded([*on_host, tiny, other, retired])
    delta = changes[-1]
    assert delta is not None and after.last_seq == delta.seq
    # n2 holds less, and n1's host reserves less for it: both rows are sent; the instance retires
    assert {n.node_id: (n.reserved_bytes, n.host_reserved_bytes) for n in delta.nodes} == {
        "n1": (1.5 * GIB, 3 * GIB),
        "n2": (1.5 * GIB, 3 * GIB),
    }
    assert [(i.instance_id, i.state) for i in delta.instances] == [("i2", "retired")]


def test_an_instance_shows_its_batch_apart_from_its_queue_and_a_model_its_waiting_tasks() -> None:
    ev = Events()
    events: list[LogEvent] = [ev.node("n1"), ev.node("n2"), with_memory(ev.placed("i1", ("n1", "n2")), "tiny", 1)]
    events += [ev.runner(0, "ready"), ev.runner(1, "ready")]
    events += [ev.created("decoding"), ev.assigned("decoding"), ev.started("decoding", 0), ev.chunk("decoding")]
    events += [ev.created("prefilling"), ev.assigned("prefilling"), ev.started("prefilling", 1)]
    events += [ev.created("queued"), ev.assigned("queued"), for_model(ev.created("waiting"), OTHER)]
    state, changes = folded(events)
    summary = snapshot(state, ("tiny",))
    (instance,) = summary.instances
    assert (instance.state, instance.running, instance.queued) == ("ready", ("decoding", "prefilling"), ("queued",))
    assert instance.placement_reason == "tiny: the fewest nodes that hold it"
    assert [(s.node_id, s.start_layer, s.end_layer, s.memory_bytes) for s in instance.shards] == [
        ("n1", 0, 4, GIB),
        ("n2", 4, 8, GIB),
    ]
    models = {m.model: (m.state, m.waiting) for m in summary.models}
    assert models == {"tiny": ("placed", ()), OTHER: ("waiting", ("waiting",))}

    # An operator unloads tiny: its instance drains (finishing its tasks), and says so at once.
    unload = ModelUnloadRequested(env=ev.api.stamp(), model="tiny")
    _, changes = folded([*events, unload])
    delta = changes[-1]
    assert delta is not None and [(i.instance_id, i.state) for i in delta.instances] == [("i1", "draining")]
    assert [(m.model, m.state) for m in delta.models] == [("tiny", "draining")]


def test_a_chunk_changes_only_its_tasks_row() -> None:
    """Most of a log is chunks: a chunk's delta is its task's row; past a task's first chunk the
    instance, model and node rows are not even built (see `services.api.dashboard`)."""
    ev = Events()
    events: list[LogEvent] = [ev.node("n1"), ev.node("n2"), ev.placed("i1", ("n1", "n2")), ev.created("t1")]
    events += [ev.assigned("t1"), ev.started("t1", 0), ev.chunk("t1", 0), ev.chunk("t1", 1)]
    _state, changes = folded(events)
    started, first, second = changes[-3:]
    assert started is not None and [i.running for i in started.instances] == [("t1",)]  # it joined the batch
    for chunk in (first, second):  # still in the batch: only the task's row moved
        assert chunk is not None and (chunk.nodes, chunk.models, chunk.instances) == ((), (), ())
    assert second is not None and [t.completion_tokens for t in second.tasks] == [2]


def test_a_model_only_an_ended_task_named_leaves_the_page() -> None:
    ev = Events()
    created = for_model(ev.created("t1"), "hub/absent")
    failed = TaskFailed(env=ev.master.stamp(), task_id=TaskId("t1"), error="cannot fit")
    state, changes = folded([created, failed])
    assert changes[0] is not None and [m.model for m in changes[0].models] == ["hub/absent"]
    assert changes[1] is not None and changes[1].gone_models == ("hub/absent",)
    assert [m.model for m in snapshot(state, ("tiny",)).models] == ["tiny"]
