"""The runner's bridge across a NATS outage longer than an append's retry window (a real
nats-server, stopped, or paused with SIGSTOP): a task spanning it completes with its whole text;
with a backlog too small for the outage it fails loudly and never completes. The retry window
is shortened to RETRY_S so an outage "longer than it" takes seconds, not the default 30."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from loguru import logger

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from eventlog.streams import LogSettings
from events.catalogue import AnyEvent, TaskCompleted, TaskFailed, Usage
from events.ids import TaskId
from events.subjects import from_any_node, subject_for, task_subject
from runner.service.bridge import LogBridge
from services.nats import EmbeddedNats
from services.ops.delivery import delivery_problems
from tests.events.builders import Events
from tests.freeze import freeze

pytestmark = pytest.mark.timeout(90)
RETRY_S = 1.0  # an append gives up after this; the outages below last several times longer
OUTAGE_S = 3.5
WORDS = [f"word{i} " for i in range(12)]


async def open_impatient_log(endpoint: NatsEndpoint) -> EventLog:
    return await EventLog.connect(endpoint, LogSettings(retry_seconds=RETRY_S), name="shoal-runner")


async def _bridge(url: str, ev: Events, limit: int) -> LogBridge:
    def build() -> LogBridge:
        bridge = LogBridge(NatsEndpoint(url=url), ev.task_rank("t1"), open_log=open_impatient_log, backlog_limit=limit)
        bridge.start()
        return bridge

    return await asyncio.to_thread(build)


async def _running_task(server: EmbeddedNats, ev: Events, limit: int) -> tuple[EventLog, LogBridge]:
    """Task t1 assigned to the 2-rank instance i1 on a fresh server; a bridge for its last rank."""
    await asyncio.to_thread(server.start)
    log = await EventLog.connect(server.url)
    await log.append_many([ev.node("n1"), ev.node("n2"), ev.placed("i1"), ev.created("t1"), ev.assigned("t1", "i1")])
    return log, await _bridge(server.url, ev, limit)


async def _end_of(log: EventLog, task_id: str) -> AnyEvent:
    subjects = [*from_any_node(task_subject(task_id, "completed")), *from_any_node(task_subject(task_id, "failed"))]
    async with asyncio.timeout(30):
        async for _seq, event in log.follow(from_seq=1, subjects=subjects):
            return event
    raise AssertionError("the log closed")


@contextmanager
def _warnings() -> Iterator[list[str]]:
    seen: list[str] = []
    sink = logger.add(lambda message: seen.append(str(message)), level="WARNING")
    try:
        yield seen
    finally:
        logger.remove(sink)


def _completed(ev: Events) -> TaskCompleted:
    usage = Usage(completion_tokens=len(WORDS))
    return TaskCompleted(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), finish_reason="length", usage=usage)


async def test_a_task_spanning_an_outage_completes_with_its_whole_text(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    server, ev = make_nats("outage"), Events()
    log, bridge = await _running_task(server, ev, limit=1000)
    try:
        chunks = [ev.chunk("t1", index=i, text=word) for i, word in enumerate(WORDS)]
        for chunk in chunks[:4]:
            bridge.publish(chunk)
        with _warnings() as warnings:
            await asyncio.to_thread(server.stop)
            for chunk in chunks[4:]:
                bridge.publish(chunk)
            bridge.publish(_completed(ev))
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(server.start)
            assert isinstance(await _end_of(log, "t1"), TaskCompleted)
        assert any("still cannot publish" in line for line in warnings)  # it outlasted the retry window
        records = [entry async for entry in log.replay()]
        problems = delivery_problems(records, await log.fold(), {"t1": "".join(WORDS)})
        assert problems == []
        assert not bridge.is_cancelled("t1")
    finally:
        await asyncio.to_thread(bridge.close)
        await log.close()


async def test_an_outage_past_the_backlog_fails_the_task_loudly_and_never_completes_it(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    server, ev = make_nats("paused"), Events()
    log, bridge = await _running_task(server, ev, limit=3)
    assert server.pid is not None
    freeze(server.pid)
    try:
        for i, word in enumerate(WORDS):
            bridge.publish(ev.chunk("t1", index=i, text=word))
        bridge.publish(_completed(ev))
        assert bridge.is_cancelled("t1")  # the ranks stop a task whose output cannot reach the log
        await asyncio.sleep(OUTAGE_S)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    try:
        failed = await _end_of(log, "t1")
        assert isinstance(failed, TaskFailed) and "could not publish" in failed.error
        assert failed.rank == 1
    finally:
        await asyncio.to_thread(bridge.close)  # everything queued is published (or dropped) by now
    try:
        assert await log.get_last(subject_for(_completed(ev))) is None  # where its rank would end it
        state = await log.fold()
        assert state.tasks[TaskId("t1")].status == "failed"
        assert state.tasks[TaskId("t1")].text == "".join(WORDS[:3])  # a prefix, then the failure
    finally:
        await log.close()


async def test_an_event_the_log_refuses_fails_its_task_and_nothing_of_it_follows(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    server, ev = make_nats("refusing"), Events()
    log, bridge = await _running_task(server, ev, limit=1000)
    try:
        bridge.publish(ev.chunk("t1", index=0, text="kept "))
        bridge.publish(ev.chunk("t1", index=1, text="x" * (2 << 20)))  # over the server's max payload
        bridge.publish(ev.chunk("t1", index=2, text="after the hole"))
        bridge.publish(_completed(ev))
        failed = await _end_of(log, "t1")
        assert isinstance(failed, TaskFailed) and "refused its ChunkGenerated" in failed.error
    finally:
        await asyncio.to_thread(bridge.close)
    try:
        assert await log.get_last(subject_for(_completed(ev))) is None  # where its rank would end it
        assert (await log.fold()).tasks[TaskId("t1")].text == "kept "
    finally:
        await log.close()


async def test_chunks_queued_while_the_log_is_paused_go_out_coalesced_with_the_same_text(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    """NATS paused for less than the retry window: the first chunk waits in its append, the rest
    pile up behind it and reach the log as one chunk; the task's text and tokens are whole."""
    server, ev = make_nats("coalesce"), Events()
    log, bridge = await _running_task(server, ev, limit=1000)
    assert server.pid is not None
    chunks = [ev.chunk("t1", index=i, text=word) for i, word in enumerate(WORDS)]
    try:
        freeze(server.pid)
        try:
            for chunk in chunks:
                bridge.publish(chunk)
            bridge.publish(_completed(ev))
            await asyncio.sleep(RETRY_S / 2)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert isinstance(await _end_of(log, "t1"), TaskCompleted)
        records = [entry async for entry in log.replay(subjects=from_any_node(task_subject("t1", "chunk_generated")))]
        assert 1 <= len(records) <= 2  # (the one in flight, if it left before the rest came), then one
        assert delivery_problems(records, await log.fold(), {"t1": "".join(WORDS)}) == []
        assert (await log.fold()).tasks[TaskId("t1")].text == "".join(WORDS)
    finally:
        await asyncio.to_thread(bridge.close)
        await log.close()


async def test_a_refused_event_sent_beside_other_tasks_fails_only_its_own_task(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    """Events of several tasks that waited together leave in one write (`append_pipelined`). One
    of them is over the server's max payload, and the server drops the connection at it: the
    others, and every later event, are resent one by one; only that task fails."""
    server, ev = make_nats("refused-beside"), Events()
    await asyncio.to_thread(server.start)
    log = await EventLog.connect(server.url)
    tasks = ["t1", "t2", "t3"]
    setup = [ev.node("n1"), ev.node("n2"), ev.placed("i1")]
    await log.append_many([*setup, *(e for t in tasks for e in (ev.created(t), ev.assigned(t, "i1")))])
    bridge = await _bridge(server.url, ev, limit=1000)
    assert server.pid is not None

    def completed(task_id: str) -> TaskCompleted:
        return TaskCompleted(env=ev.task_rank(task_id).stamp(), task_id=TaskId(task_id), finish_reason="stop")

    try:
        freeze(server.pid)  # what follows the first event waits behind it, then leaves together
        try:
            bridge.publish(ev.chunk("t1", index=0, text="one "))
            bridge.publish(ev.chunk("t2", index=0, text="x" * (2 << 20)))
            bridge.publish(ev.chunk("t3", index=0, text="three "))
            bridge.publish(ev.chunk("t1", index=1, text="more"))
            bridge.publish(completed("t3"))
            bridge.publish(ev.chunk("t2", index=1, text="after the hole"))
            bridge.publish(completed("t1"))
            bridge.publish(completed("t2"))
            await asyncio.sleep(RETRY_S / 2)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        ends = {t: await _end_of(log, t) for t in tasks}
    finally:
        await asyncio.to_thread(bridge.close)
    try:
        assert isinstance(ends["t1"], TaskCompleted) and isinstance(ends["t3"], TaskCompleted)
        assert isinstance(ends["t2"], TaskFailed) and "refused its ChunkGenerated" in ends["t2"].error
        state = await log.fold()
        assert [state.tasks[TaskId(t)].text for t in tasks] == ["one more", "", "three "]
        assert await log.get_last(subject_for(completed("t2"))) is None
    finally:
        await log.close()
