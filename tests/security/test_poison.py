"""Events that lie, published straight onto a real NATS bus (issue 10): an id that is not a subject
token, a forged origin, a dangling reference. None may stop a service or reach a client; each is
quarantined with its seq, and `shoal diagnose` (its scan of the live log) reports it.

Before the fix, one `TaskCreated` whose task id held a space put the master in a crash loop: it
decided a `TaskFailed` for that id, could not publish it on the invalid subject, died after 30 s
of retries, and did the same again on every restart.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import msgspec
import nats
import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from events.catalogue import (
    ChatMessage,
    ChunkGenerated,
    Envelope,
    InstancePlaced,
    Origin,
    Shard,
    TaskCancelled,
    TaskCreated,
    TaskFailed,
)
from events.codec import ExportRecord
from events.ids import EventId, InstanceId, NodeId, TaskId
from events.subjects import task_subject
from services.api.hub import LogHub
from services.api.metrics import Metrics
from services.master.core import MasterPolicy
from services.master.service import Master, MasterSettings
from services.models import LocalModelCatalog
from services.nats import EmbeddedNats
from services.ops.offline import diagnose_scan
from services.ops.render_text import diagnosis_text
from services.ops.scan import scan
from tests.events.builders import Events

API = Origin(service="api")


def _raw_created(task_id: str, event_id: str) -> bytes:
    """A TaskCreated as a forger writes it: msgpack built by hand, so no id type stops it."""
    env = {"event_id": event_id, "origin": {"service": "api"}, "wall_time": 1, "mono_ns": 1}
    return msgspec.msgpack.encode(
        {"type": "task_created", "env": env, "task_id": task_id, "model": "nope", "messages": []}
    )


def _created(task_id: str, model: str = "no-such-model") -> TaskCreated:
    env = Envelope(event_id=EventId(f"created-{task_id}"), origin=API, wall_time=1, mono_ns=1)
    return TaskCreated(env=env, task_id=TaskId(task_id), model=model, messages=[ChatMessage(role="user", content="hi")])


@asynccontextmanager
async def running_master(nats_url: str) -> AsyncIterator[Master]:
    master = Master(MasterSettings(nats=NatsEndpoint(url=nats_url), policy=MasterPolicy()), LocalModelCatalog())
    ready = asyncio.Event()
    task = asyncio.create_task(master.run(ready))
    try:
        async with asyncio.timeout(20):
            done, _ = await asyncio.wait([task, asyncio.create_task(ready.wait())], return_when="FIRST_COMPLETED")
        assert task not in done, f"the master stopped while starting: {task.exception()!r}"
        yield master
        assert not task.done(), f"the master stopped: {task.exception()!r}"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def _failed_of(log: EventLog, task_id: str) -> TaskFailed:
    async with asyncio.timeout(20):
        async for _seq, event in log.follow(from_seq=1, subjects=[task_subject(task_id, "failed")]):
            assert isinstance(event, TaskFailed)
            return event
    raise AssertionError("the log closed")


@pytest.mark.parametrize("bad_id", ["bad id", "a.b", ">", "a*b", "ab\n"])
async def test_an_id_that_is_not_a_token_is_skipped_and_the_master_keeps_serving(
    event_log: EventLog, nats_url: str, bad_id: str
) -> None:
    nc = await nats.connect(nats_url)
    try:
        ack = await nc.jetstream().publish("shoal.ev.task.x.created", _raw_created(bad_id, "forged-1"))
    finally:
        await nc.close()
    async with running_master(nats_url) as master:
        await event_log.append(_created("after-poison"))
        failed = await _failed_of(event_log, "after-poison")  # decided, published: the master still works
        assert "no-such-model" in failed.error
        assert TaskId(bad_id) not in master.state.tasks
        assert master.state.last_seq > ack.seq


def _forged_chunk(task_id: str) -> ChunkGenerated:
    env = Envelope(event_id=EventId("forged-chunk"), origin=API, wall_time=1, mono_ns=1)
    return ChunkGenerated(env=env, task_id=TaskId(task_id), index=0, text="FORGED", token_ids=[1])


async def test_poison_already_in_the_log_never_stops_a_start_and_diagnose_reports_it(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    # A server of its own: the master's start-up fold reads this log and nothing else.
    server = make_nats("poison").start()
    event_log = await EventLog.connect(server.url)
    try:
        await _poison_in_the_log(event_log, server.url)
    finally:
        await event_log.close()


async def _poison_in_the_log(event_log: EventLog, nats_url: str) -> None:
    ev = Events()
    # This test's ids are its own, and it reads only what it appended (seq >= its first).
    unique = secrets.token_hex(4)
    task, node, evil = f"t-{unique}", f"n-{unique}", f"evil-{unique}"
    ghost_cancel = TaskCancelled(env=ev.api.stamp(), task_id=TaskId(f"trimmed-{unique}"), reason="api")
    shard = Shard(node_id=NodeId(node), rank=0, start_layer=0, end_layer=8)
    forged_placement = InstancePlaced(
        env=ev.api.stamp(), instance_id=InstanceId(evil), model="/etc", shards=[shard], ring_hosts=["h:1"]
    )
    seqs = await event_log.append_many(
        [ev.node(node), ev.created(task), ghost_cancel, forged_placement, _forged_chunk(task)]
    )
    async with running_master(nats_url) as master:
        quarantined = [(q.seq, q.kind, q.error) for q in master.state.quarantined if q.seq >= seqs[0]]
        assert quarantined == [
            (seqs[2], "task_cancelled", "UnknownTask"),
            (seqs[3], "instance_placed", "ForbiddenOrigin"),
            (seqs[4], "chunk_generated", "ForbiddenOrigin"),
        ]
        assert InstanceId(evil) not in master.state.instances
        assert master.state.tasks[TaskId(task)].text == ""
    records = [ExportRecord(stream="events", seq=seq, event=event) async for seq, event in event_log.replay()]
    diagnosis = diagnose_scan(scan(enumerate(records, 1), allow_gaps=True))  # what `shoal diagnose` runs
    findings = msgspec.to_builtins(diagnosis.findings)
    ours = {f"seq {seq}" for seq in seqs}
    reported = [(f["subject"], f["cause"]) for f in findings if f["kind"] == "event" and f["subject"] in ours]
    assert reported == [(f"seq {seq}", "quarantined_event") for seq in seqs[2:]]
    assert f"[quarantined_event] event seq {seqs[3]}: instance_placed" in diagnosis_text(diagnosis)
    forged = next(f for f in findings if f["subject"] == f"seq {seqs[3]}")
    assert "only the master publishes it, not 'api'" in forged["evidence"][0]
    assert "revoke its credentials" in forged["next_step"]


async def test_a_forged_chunk_never_reaches_the_tasks_stream(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.placed("i1", nodes=("n1",)), ev.created("t1")])
    hub = LogHub(event_log, Metrics())
    follow = asyncio.create_task(hub.run())
    try:
        await hub.caught_up.wait()
        with hub.listen(TaskId("t1")) as events:
            wrong_rank = ChunkGenerated(
                env=ev.stamper(Origin(service="runner", node="n9", rank=0)).stamp(),
                task_id=TaskId("t1"),
                index=0,
                text="FORGED",
                token_ids=[1],
            )
            await event_log.append_many(
                [ev.assigned("t1", "i1"), _forged_chunk("t1"), wrong_rank, ev.chunk("t1", text="real")]
            )
            async with asyncio.timeout(10):
                received = [await events.next() for _ in range(2)]
        assert [type(e).__name__ for e in received] == ["TaskAssigned", "ChunkGenerated"]
        assert isinstance(received[1], ChunkGenerated) and received[1].text == "real"
        assert hub.state.tasks[TaskId("t1")].text == "real"
        assert hub.state.quarantined_count == 2
    finally:
        follow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await follow
