"""An identity speaks only for its own node (issue 43), against a real nats-server configured as
`shoal up` configures it.

Task t1 runs on instance i1: rank 0 on node-a, rank 1 (the sampling rank) on node-b. An attacker
holding node-a's runner seed is what issue 43 tried: the server refuses node-b's subjects to it,
and what it may publish on its own subjects is held by the fold to the subject the server checked
(a claimed node-b origin) and to the State (rank 0 neither reports tokens nor completes a task).
Every event here is read back from the bus, so the subject each fold sees is the server's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.export import fold_export, write_export
from eventlog.log import EventLog
from eventlog.wire import Wire, request
from events.catalogue import (
    AnyEvent,
    ChunkGenerated,
    LogEvent,
    NodeHeartbeat,
    Origin,
    RunnerHeartbeat,
    TaskCompleted,
    TaskFailed,
)
from events.codec import encode
from events.fold import apply_live
from events.ids import InstanceId, NodeId, TaskId
from events.origins import heartbeat_refusal
from events.stamp import Stamper
from events.state import State
from events.subjects import subject_for, task_events
from services.nats_permissions import Identity
from services.ops.scan import scan
from services.ops.sources import _read_live  # pyright: ignore[reportPrivateUsage]
from tests.e2e.cluster import Cluster
from tests.events.builders import Events
from tests.security.conftest import SecuredBus

T1, I1 = TaskId("t1"), InstanceId("i1")
RUNNER_A = Identity("runner", "node-a")
WORKER_A = Identity("worker", "node-a")
AS_RANK0_OF_A = Origin(service="runner", node="node-a", rank=0)  # what node-a's runner really is
AS_RANK1_OF_B = Origin(service="runner", node="node-b", rank=1)  # the forgery: node-b's sampling rank


@pytest.fixture
async def serving(admin_log: EventLog) -> AsyncIterator[Events]:
    """The log of a cluster serving t1 on i1 (node-a rank 0, node-b rank 1), written by the
    admin as each service would have (their origins)."""
    ev = Events()
    history: list[LogEvent] = [
        ev.node("node-a"),
        ev.node("node-b"),
        ev.placed("i1", nodes=("node-a", "node-b")),
        ev.runner(0, "ready"),
        ev.runner(1, "ready"),
        ev.created("t1"),
        ev.assigned("t1", "i1"),
        ev.chunk("t1", text="honest "),
    ]
    await admin_log.append_many(history)
    yield ev


async def publish_as(bus: SecuredBus, identity: Identity, subject: str, event: AnyEvent) -> str:
    """`event` published by `identity` on `subject` (the payload need not agree with it, as a
    forger's would not), waiting for JetStream's acknowledgement; what the server says ("" =
    stored)."""
    wire = await Wire.open(bus.url, identity=bus.identity(identity))
    try:
        ack = await request(wire, subject, encode(event))
    except ConnectionError as exc:
        return str(exc)
    finally:
        wire.close()
    assert b'"seq"' in ack, ack  # stored
    return ""


async def folds(bus: SecuredBus, identity: Identity) -> list[State]:
    """The State as a starting service folds it (`EventLog.fold`) and as a following one does
    (`deliveries` + `apply_live`), both from the bus, as `identity` reads it."""
    log = await EventLog.connect(bus.endpoint(identity))
    try:
        state = State()
        async for seq, event, subject in log.deliveries(live=False):
            state, _error = apply_live(state, seq, event, subject)
        return [await log.fold(), state]
    finally:
        await log.close()


def _chunk(origin: Origin, text: str) -> ChunkGenerated:
    return ChunkGenerated(env=Stamper(origin).stamp(), task_id=T1, index=1, text=text, token_ids=[7])


async def test_node_as_runner_forging_node_bs_rank_is_refused_by_the_server(
    bus: SecuredBus, admin_log: EventLog, serving: Events
) -> None:
    before = await admin_log.last_seq()
    for forged in (
        _chunk(AS_RANK1_OF_B, "FORGED"),
        TaskCompleted(env=Stamper(AS_RANK1_OF_B).stamp(), task_id=T1, finish_reason="stop"),
    ):
        subject = subject_for(forged)
        assert subject.endswith(".node-b")
        said = await publish_as(bus, RUNNER_A, subject, forged)
        assert f'Permissions Violation for Publish to "{subject}"' in said
    assert await admin_log.last_seq() == before


async def test_node_bs_origin_on_node_as_subject_is_stored_but_quarantined_by_every_fold(
    bus: SecuredBus, admin_log: EventLog, serving: Events
) -> None:
    """The server takes it (node-a's own subject), and checks no payload: the fold does, against
    that subject, and every fold of tasks agrees (the API's and the master's: a node's identities
    fold no task, `test_read_privilege.py`)."""
    before = await admin_log.last_seq()
    forged = _chunk(AS_RANK1_OF_B, "FORGED")
    on_node_a = f"{subject_for(forged).removesuffix('.node-b')}.node-a"
    assert await publish_as(bus, RUNNER_A, on_node_a, forged) == ""
    for identity in (Identity("api"), Identity("master")):
        for state in await folds(bus, identity):
            assert state.tasks[T1].text == "honest ", identity.name  # the marker never reached the task
            (record,) = state.quarantined
            assert (record.seq, record.kind, record.error) == (before + 1, "chunk_generated", "Misrouted")
            assert "claiming node 'node-b'" in record.reason and "'shoal.ev.task.t1.chunk_generated.node-a'" in (
                record.reason
            )


async def test_diagnose_and_an_export_fold_the_forgery_as_the_services_do(
    bus: SecuredBus, admin_log: EventLog, serving: Events, tmp_path: Path
) -> None:
    """Offline folds keep the subject each event was stored on: `shoal diagnose` of the live log
    and the fold of an export file quarantine the same forgery as the services' folds."""
    forged = _chunk(AS_RANK1_OF_B, "FORGED")
    on_node_a = f"{subject_for(forged).removesuffix('.node-b')}.node-a"
    assert await publish_as(bus, RUNNER_A, on_node_a, forged) == ""
    records = await _read_live(bus.endpoint(Identity("admin")))
    export = tmp_path / "log.jsonl"
    with export.open("wb") as out:
        write_export(records, out)
    for state in (scan(enumerate(records, 1), allow_gaps=True).state, fold_export(export)):
        assert [q.error for q in state.quarantined] == ["Misrouted"]
        assert state.tasks[T1].text == "honest "


async def test_node_as_rank_0_can_neither_stream_nor_end_the_task_it_serves(
    bus: SecuredBus, admin_log: EventLog, serving: Events
) -> None:
    """Issue 43's second finding: node-a legitimately holds rank 0 of t1's instance, so a chunk
    or a completion it publishes as itself passes the server; only the last rank samples, so the
    fold refuses both, and the task goes on. A failure it reports is taken (a rank that breaks
    says why), as from any rank of the task's instance."""
    before = await admin_log.last_seq()
    rank0 = Stamper(AS_RANK0_OF_A)
    for event in (
        _chunk(AS_RANK0_OF_A, "FORGED"),
        TaskCompleted(env=rank0.stamp(), task_id=T1, finish_reason="stop"),
    ):
        assert await publish_as(bus, RUNNER_A, subject_for(event), event) == ""
    for state in await folds(bus, Identity("master")):
        task = state.tasks[T1]
        assert task.status != "completed" and task.text == "honest "
        assert [(q.seq, q.error) for q in state.quarantined] == [
            (before + 1, "ForbiddenOrigin"),
            (before + 2, "ForbiddenOrigin"),
        ]
        assert all("sampling rank (1)" in q.reason for q in state.quarantined)
    failed = TaskFailed(env=rank0.stamp(), task_id=T1, error="rank 0 failed: MemoryError", rank=0)
    assert await publish_as(bus, RUNNER_A, subject_for(failed), failed) == ""
    for state in await folds(bus, Identity("master")):
        assert state.tasks[T1].status == "failed" and state.quarantined_count == 2


async def test_a_worker_forging_another_nodes_heartbeat_is_refused_or_not_believed(
    bus: SecuredBus, admin_log: EventLog, serving: Events
) -> None:
    """On node-b's subject the server refuses it; on node-a's own, the master's reader holds the
    beat to the subject it came on (`heartbeat_refusal`, what `Master._follow_heartbeats` asks)
    and does not count it as node-b alive. A runner's beat for node-b's rank likewise."""
    forged = NodeHeartbeat(env=Stamper(Origin(service="worker", node="node-a")).stamp(), node_id=NodeId("node-b"))
    said = await publish_as(bus, WORKER_A, subject_for(forged), forged)
    assert 'Permissions Violation for Publish to "shoal.hb.node.node-b"' in said
    assert await publish_as(bus, WORKER_A, "shoal.hb.node.node-a", forged) == ""
    rank1_beat = RunnerHeartbeat(env=Stamper(AS_RANK0_OF_A).stamp(), instance_id=I1, rank=1, phase="decode")
    assert await publish_as(bus, RUNNER_A, subject_for(rank1_beat), rank1_beat) == ""
    own_beat = RunnerHeartbeat(env=Stamper(AS_RANK0_OF_A).stamp(), instance_id=I1, rank=0, phase="decode")
    assert await publish_as(bus, RUNNER_A, subject_for(own_beat), own_beat) == ""
    state = (await folds(bus, Identity("master")))[0]
    log = await EventLog.connect(bus.endpoint(Identity("master")))
    try:
        heard = [
            (type(beat).__name__, heartbeat_refusal(state, beat, subject))
            async for _seq, beat, subject in log.deliveries(stream="telemetry", live=False)
        ]
    finally:
        await log.close()
    (node_beat, node_refusal), (forged_rank, rank_refusal), (own, own_refusal) = heard
    assert node_beat == "NodeHeartbeat" and node_refusal is not None and "'shoal.hb.node.node-b'" in node_refusal
    assert forged_rank == "RunnerHeartbeat" and rank_refusal is not None and "beats for rank 1" in rank_refusal
    assert own == "RunnerHeartbeat" and own_refusal is None


async def _served(endpoint: NatsEndpoint) -> tuple[State, list[tuple[str, str]]]:
    """The State of a cluster's log, and (kind token, publishing node) of each of its tasks'
    node-published events, as the bus stored them."""
    log = await EventLog.connect(endpoint, ensure=False)
    try:
        state = await log.fold()
        published: list[tuple[str, str]] = []
        for task_id in state.tasks:
            async for _seq, _event, subject in log.deliveries(subjects=[task_events(task_id)], live=False):
                tokens = subject.decode().split(".")
                if len(tokens) == 6:  # shoal.ev.task.<task>.<kind>.<node>
                    published.append((tokens[4], tokens[5]))
        return state, published
    finally:
        await log.close()


def test_a_two_node_cluster_serves_with_every_event_on_its_publishers_subject(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The honest side of the rules: under `shoal up`'s identities, a model split over two nodes
    streams its tokens from the last rank's node, and nothing the services published is refused."""
    cluster = Cluster(tmp_path_factory.mktemp("two-nodes"), workers=2)
    try:
        cluster.wait_ready()
        stream = cluster.client().chat.completions.create(
            model="tiny", max_tokens=8, stream=True, messages=[{"role": "user", "content": "hello"}]
        )
        assert [chunk for chunk in stream if chunk.choices and chunk.choices[0].finish_reason]
        state, published = asyncio.run(_served(cluster.admin_endpoint()))
    finally:
        cluster.stop()
    assert state.quarantined_count == 0, state.quarantined
    (task,) = state.tasks.values()
    assert task.status == "completed" and task.instance_id is not None
    ranks = state.instances[task.instance_id].runners
    assert len({rank.node_id for rank in ranks}) == 2, ranks  # split over both nodes
    sampling_node = ranks[-1].node_id
    assert {node for kind, node in published if kind in ("chunk_generated", "completed")} == {sampling_node}
    assert {kind for kind, _node in published} >= {"chunk_generated", "completed", "prefill_started"}
