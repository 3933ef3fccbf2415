"""The worker announces its node again: the pure rule (`services.worker.plan.rejoin_cause`), then
the shell on a real nats-server (after a restart of the server, after folding its own timeout)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio.to_thread
import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from events.catalogue import LogEvent, NodeJoined, NodeLeft, NodeTimedOut
from events.fold import apply_live
from events.ids import NodeId
from events.state import State
from events.vocabulary import JoinCause
from services.nats import EmbeddedNats
from services.worker.plan import rejoin_cause
from services.worker.service import Worker, WorkerSettings
from tests.events.builders import Events

ME = NodeId("n1")

Case = Callable[[Events], LogEvent]


def _timed_out(node: str) -> Case:
    return lambda ev: NodeTimedOut(env=ev.master.stamp(), node_id=NodeId(node), last_seen=1)


def _left(node: str) -> Case:
    return lambda ev: NodeLeft(env=ev.worker(node).stamp(), node_id=NodeId(node), reason="shutdown")


def _forged_timeout(ev: Events) -> LogEvent:
    """A timeout published by a worker: quarantined by the fold, so the node stays up."""
    return NodeTimedOut(env=ev.worker("n2").stamp(), node_id=ME, last_seen=1)


CASES: list[tuple[str, Case, JoinCause | None]] = [
    ("my node timed out", _timed_out("n1"), "timed_out"),
    ("my node left (a stale incarnation)", _left("n1"), "left"),
    ("another node timed out", _timed_out("n2"), None),
    ("another node left", _left("n2"), None),
    ("a forged timeout the fold refused", _forged_timeout, None),
    ("a task event", lambda ev: ev.created("t1"), None),
]


@pytest.mark.parametrize(("name", "make", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rejoin_cause(name: str, make: Case, expected: JoinCause | None) -> None:
    ev = Events()
    state = State()
    for event in (ev.node("n1"), ev.node("n2")):
        state, _ = apply_live(state, state.last_seq + 1, event)
    event = make(ev)
    state, _ = apply_live(state, state.last_seq + 1, event)
    assert rejoin_cause(state, ME, event) == expected


# --- the shell, on a real nats-server ------------------------------------------------------------


def _settings(url: str) -> WorkerSettings:
    endpoint = NatsEndpoint(url=url)
    return WorkerSettings(nats=endpoint, runner_nats=endpoint, node_id=ME, heartbeat_interval_seconds=0.2, blas="off")


async def _joins(log: EventLog, count: int, timeout: float = 30.0) -> list[NodeJoined]:
    """The node's announcements in the log, once there are `count` of them."""
    async with asyncio.timeout(timeout):
        while True:
            joins = [e async for _, e in log.replay() if isinstance(e, NodeJoined) and e.node_id == ME]
            if len(joins) >= count:
                return joins
            await asyncio.sleep(0.1)


@asynccontextmanager
async def _running(worker: Worker) -> AsyncIterator[None]:
    ready = asyncio.Event()
    task = asyncio.create_task(worker.run(ready))
    try:
        async with asyncio.timeout(30):
            await ready.wait()
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_worker_announces_its_node_again_after_a_nats_restart(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    server = await anyio.to_thread.run_sync(make_nats("reconnect").start)
    log = await EventLog.connect(server.url)
    try:
        async with _running(Worker(_settings(server.url))):
            assert [j.cause for j in await _joins(log, 1)] == ["start"]
            await anyio.to_thread.run_sync(server.stop)
            await asyncio.sleep(0.3)
            await anyio.to_thread.run_sync(server.start)
            assert [j.cause for j in await _joins(log, 2)] == ["start", "reconnect"]
    finally:
        await log.close()


async def test_a_worker_that_folds_its_own_timeout_announces_its_node_once(event_log: EventLog) -> None:
    """The log says the node timed out while its worker runs: the worker brings it back, with an
    id derived from the timeout, so the same timeout stored twice brings one announcement."""
    async with _running(Worker(_settings(event_log.url))):
        await _joins(event_log, 1)
        timeout = NodeTimedOut(env=Events().master.stamp("timeout-n1-1"), node_id=ME, last_seen=1)
        await event_log.append(timeout)
        joins = await _joins(event_log, 2)
        assert [(j.cause, j.env.event_id) for j in joins[1:]] == [("timed_out", "rejoin-n1-timeout-n1-1")]
        await event_log.append(timeout)  # a retried publish: stored once, folded once
        await asyncio.sleep(1.0)
        assert len(await _joins(event_log, 2)) == 2
        state = await event_log.fold()
        assert state.nodes[ME].status == "up"
