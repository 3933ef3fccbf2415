"""A node reads only what it serves (issue 43, item 2), against a real nats-server configured as
`shoal up` configures it.

Task t1 runs on instance i1 (node-a rank 0, node-b rank 1), task t2 on i2 (node-b alone). Every
refusal here is the SERVER's: an attacker holding node-a's worker or runner seed, speaking the
protocol by hand, cannot read t2's request (its `TaskCreated`) nor anyone's output (chunks) from
the log — not by subscribing, not by an unfiltered consumer or one with several filters, not by a
consumer filtered to another node's subjects or to the requests, not by a message get, not from
the snapshot. What each node identity's job needs still flows: the worker's fold of nodes and
instances, the runner's placement, assignments and cancels, and t1's request handed to node-a by
the masters' desk (`services.master.handover`), which refuses t2 to node-a.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from eventlog.families import fold_families, read_family
from eventlog.log import EventLog
from eventlog.wire import Wire, WireError, request
from events.catalogue import ChatMessage, LogEvent, TaskAssigned, TaskCancelled, TaskCreated
from events.handover import (
    HandedOver,
    HandOverAsk,
    HandOverRefused,
    decode_reply,
    encode_handover,
    handover_subject,
)
from events.ids import TaskId
from events.state import State
from events.subjects import EVENTS_STREAM, RUNNER_READS, WORKER_FAMILIES, instance_subject
from services.master.handover import FoldProgress, HandOverDesk
from services.nats_permissions import Identity
from tests.e2e.cluster import Cluster
from tests.events.builders import Events
from tests.security.conftest import SecuredBus

WORKER_A, RUNNER_A = Identity("worker", "node-a"), Identity("runner", "node-a")
NODE_A = (WORKER_A, RUNNER_A)
SECRET = "the prompt of t2, node-b's task"


@pytest.fixture
async def serving(admin_log: EventLog) -> AsyncIterator[list[LogEvent]]:
    ev = Events()
    t2 = ev.created("t2")
    t2 = TaskCreated(
        env=t2.env, task_id=t2.task_id, model=t2.model, messages=[ChatMessage(role="user", content=SECRET)]
    )
    history: list[LogEvent] = [
        ev.node("node-a"),
        ev.node("node-b"),
        ev.placed("i1", nodes=("node-a", "node-b")),
        ev.placed("i2", nodes=("node-b",)),
        ev.created("t1"),
        ev.assigned("t1", "i1"),
        t2,
        ev.assigned("t2", "i2"),
        ev.chunk("t2", text="node-b's answer"),
        TaskCancelled(env=ev.api.stamp(), task_id=TaskId("t2"), reason="api"),
    ]
    await admin_log.append_many(history)
    yield history


async def js_request(bus: SecuredBus, identity: Identity, subject: str, body: dict[str, object]) -> str:
    """What the server answers `identity`'s JetStream request: a permissions violation (the
    server's -ERR), a JetStream API error, or "" when it was done."""
    wire = await Wire.open(bus.url, identity=bus.identity(identity))
    try:
        reply = json.loads(await request(wire, subject, json.dumps(body).encode(), timeout=3.0))
    except (WireError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        wire.close()
    error = reply.get("error")
    return "" if error is None else f"JetStream: {error.get('description')}"


def consumer(filters: list[str]) -> dict[str, object]:
    config: dict[str, object] = {"deliver_policy": "all", "ack_policy": "none", "deliver_subject": "_INBOX.x"}
    if len(filters) == 1:
        config["filter_subject"] = filters[0]
    elif filters:
        config["filter_subjects"] = filters
    return {"stream_name": EVENTS_STREAM, "config": config, "action": "create"}


CREATE = f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.peek"
NODE_IDENTITIES = (*NODE_A, Identity("worker", "node-b"), Identity("runner", "node-b"))


def stolen_reads(other: str) -> list[tuple[str, str, list[str]]]:
    """(what, create request's subject, the consumer's filters) a node would steal with: the
    requests, the answers, everything; `other`: another node."""
    return [
        ("unfiltered", CREATE, []),
        ("several filters", CREATE, ["shoal.ev.task.*.assigned", "shoal.ev.task.*.created"]),
        ("the requests", f"{CREATE}.shoal.ev.task.*.created", ["shoal.ev.task.*.created"]),
        ("t2's request", f"{CREATE}.shoal.ev.task.t2.created", ["shoal.ev.task.t2.created"]),
        ("every task event", f"{CREATE}.shoal.ev.task.>", ["shoal.ev.task.>"]),
        ("everything", f"{CREATE}.>", [">"]),
        (
            f"{other}'s chunks",
            f"{CREATE}.shoal.ev.task.*.chunk_generated.{other}",
            [f"shoal.ev.task.*.chunk_generated.{other}"],
        ),
        ("any node's chunks", f"{CREATE}.shoal.ev.task.*.chunk_generated.*", ["shoal.ev.task.*.chunk_generated.*"]),
    ]


STOLEN_READS = [
    (identity, *case)
    for identity in NODE_IDENTITIES
    for case in stolen_reads("node-b" if identity.node == "node-a" else "node-a")
]


@pytest.mark.parametrize(
    ("identity", "what", "subject", "filters"), STOLEN_READS, ids=[f"{c[0].name}-{c[1]}" for c in STOLEN_READS]
)
async def test_a_node_cannot_create_a_consumer_reading_what_it_does_not_serve(
    bus: SecuredBus, serving: list[LogEvent], identity: Identity, what: str, subject: str, filters: list[str]
) -> None:
    said = await js_request(bus, identity, subject, consumer(filters))
    assert f'Permissions Violation for Publish to "{subject}"' in said, what


@pytest.mark.parametrize("identity", NODE_A, ids=lambda i: i.name)
async def test_the_filter_the_server_checked_is_the_filter_it_uses(
    bus: SecuredBus, serving: list[LogEvent], identity: Identity
) -> None:
    """An allowed filter in the create request's subject, another in its body: the server
    refuses the mismatch itself, so the permission on the subject is the consumer's filter."""
    allowed = WORKER_FAMILIES[1] if identity.role == "worker" else RUNNER_READS[1]
    said = await js_request(bus, identity, f"{CREATE}.{allowed}", consumer(["shoal.ev.task.*.created"]))
    assert said.startswith("JetStream:") and "filter" in said.lower(), said
    several = consumer([allowed, "shoal.ev.task.*.created"])
    said = await js_request(bus, identity, f"{CREATE}.{allowed}", several)
    assert said.startswith("JetStream:"), said
    assert await js_request(bus, identity, f"{CREATE}.{allowed}", consumer([allowed])) == ""  # its own: taken


@pytest.mark.parametrize("identity", NODE_IDENTITIES, ids=lambda i: i.name)
async def test_a_node_cannot_get_messages_nor_the_snapshot(
    bus: SecuredBus, serving: list[LogEvent], identity: Identity
) -> None:
    gets = [
        (f"$JS.API.STREAM.MSG.GET.{EVENTS_STREAM}", {"last_by_subj": "shoal.ev.task.t2.created"}),
        (f"$JS.API.STREAM.MSG.GET.{EVENTS_STREAM}", {"seq": 7}),
        (f"$JS.API.DIRECT.GET.{EVENTS_STREAM}.shoal.ev.task.t2.created", {}),
        (f"$JS.API.DIRECT.GET.{EVENTS_STREAM}", {"seq": 7}),
        ("$JS.API.CONSUMER.CREATE.OBJ_SHOAL_SNAPSHOTS", {}),  # the State: every task's messages and text
        ("$JS.API.CONSUMER.CREATE.OBJ_SHOAL_SNAPSHOTS.x.$O.SHOAL_SNAPSHOTS.C.>", {}),
    ]
    for subject, body in gets:
        said = await js_request(bus, identity, subject, body)
        assert f'Permissions Violation for Publish to "{subject}"' in said, subject


@pytest.mark.parametrize("identity", NODE_IDENTITIES, ids=lambda i: i.name)
async def test_a_node_cannot_tap_the_requests_live(bus: SecuredBus, identity: Identity) -> None:
    for subject in (
        "shoal.ev.task.t2.created",
        "shoal.ev.task.*.created",
        handover_subject("node-b", "t2"),
        "shoal.handover.>",
    ):
        wire = await Wire.open(bus.url, identity=bus.identity(identity))
        try:
            wire.subscribe(subject)
            with pytest.raises(WireError, match="Permissions Violation for Subscription"):
                await wire.roundtrip()
        finally:
            wire.close()


async def test_the_worker_folds_nodes_and_instances_and_no_task(bus: SecuredBus, serving: list[LogEvent]) -> None:
    log = await EventLog.connect(bus.endpoint(WORKER_A))
    try:
        state = await fold_families(log, WORKER_FAMILIES, State())
    finally:
        await log.close()
    assert set(state.nodes) == {"node-a", "node-b"} and set(state.instances) == {"i1", "i2"}
    assert not state.tasks and state.last_seq == len(serving) and state.quarantined_count == 0


async def test_the_runner_reads_its_placement_assignments_and_cancels(bus: SecuredBus, serving: list[LogEvent]) -> None:
    log = await EventLog.connect(bus.endpoint(RUNNER_A))
    try:
        placed = await log.get_last(instance_subject("i1", "placed"))
        assert placed is not None and placed[0] == 3
        assigned = await read_family(log, RUNNER_READS[1], 1, len(serving))
        assert [(seq, type(e)) for seq, e, _ in assigned] == [(6, TaskAssigned), (8, TaskAssigned)]
        cancels = await read_family(log, RUNNER_READS[2], 1, len(serving))
        assert [type(e) for _, e, _ in cancels] == [TaskCancelled]
    finally:
        await log.close()


@pytest.fixture
async def desk(bus: SecuredBus, serving: list[LogEvent], admin_log: EventLog) -> AsyncIterator[None]:
    """The masters' handover desk, as the master runs it (`Master._hand_over`), on the master's
    identity, over the master's fold of the log."""
    log = await EventLog.connect(bus.endpoint(Identity("master")))
    state = await log.fold()
    progress = FoldProgress()
    progress.advanced(state.last_seq)
    answers = HandOverDesk(lambda: state, progress, log.get)

    async def serve() -> None:
        async for subject, data, reply in log.asks(handover_subject("*", "*")):
            await log.respond(reply, encode_handover(await answers.answer(subject, data)))

    serving_task = asyncio.create_task(serve())
    await asyncio.sleep(0.2)  # the subscription is registered by the next round trip of the client
    try:
        yield
    finally:
        serving_task.cancel()
        await log.close()


async def ask_as(bus: SecuredBus, identity: Identity, node: str, task: str, seq: int) -> object:
    log = await EventLog.connect(bus.endpoint(identity))
    try:
        payload = encode_handover(HandOverAsk(task_id=TaskId(task), assigned_seq=seq))
        return decode_reply(await log.ask(handover_subject(node, task), payload, 5.0))
    finally:
        await log.close()


async def test_a_master_that_never_answers_costs_no_ask(bus: SecuredBus, desk: None, serving: list[LogEvent]) -> None:
    """A second master the server still counts as subscribed, but that never answers: what a
    master partitioned away, frozen, or with its fold blind looks like to the bus. Every ask still
    gets the answering master's answer (a queue group handed it some of them: each such ask was
    lost until the asker's timeout, again and again, until the server dropped the silent one)."""
    log = await EventLog.connect(bus.endpoint(Identity("master")))
    heard: list[str] = []

    async def never_answer() -> None:
        async for subject, _data, _reply in log.asks(handover_subject("*", "*")):
            heard.append(subject)

    silent = asyncio.create_task(never_answer())
    try:
        for _ in range(100):  # until the silent master is surely subscribed: it heard an ask
            assert isinstance(await ask_as(bus, RUNNER_A, "node-a", "t1", 6), HandedOver)
            if heard:
                break
        assert heard, "the silent master never heard an ask"
        before = len(heard)
        answers = [await ask_as(bus, RUNNER_A, "node-a", "t1", 6) for _ in range(4)]
        assert all(isinstance(a, HandedOver) and a.created == serving[4] for a in answers), answers
        assert len(heard) - before == 4, "every master hears every ask"
    finally:
        silent.cancel()
        await log.close()


async def test_a_runner_is_handed_its_tasks_request_and_no_other(
    bus: SecuredBus, desk: None, serving: list[LogEvent]
) -> None:
    handed = await ask_as(bus, RUNNER_A, "node-a", "t1", 6)
    assert isinstance(handed, HandedOver) and handed.created == serving[4]
    refused = await ask_as(bus, RUNNER_A, "node-a", "t2", 8)  # i2 has no rank on node-a
    assert isinstance(refused, HandOverRefused) and "no rank on node node-a" in refused.error
    assert SECRET not in refused.error
    # Asking as node-b, on node-b's subject: the server refuses the publish.
    wire = await Wire.open(bus.url, identity=bus.identity(RUNNER_A))
    try:
        wire.publish(handover_subject("node-b", "t2").encode(), b"")
        with pytest.raises(WireError, match="Permissions Violation for Publish"):
            await wire.roundtrip()
    finally:
        wire.close()
    # The worker does not ask at all.
    wire = await Wire.open(bus.url, identity=bus.identity(WORKER_A))
    try:
        wire.publish(handover_subject("node-a", "t1").encode(), b"")
        with pytest.raises(WireError, match="Permissions Violation for Publish"):
            await wire.roundtrip()
    finally:
        wire.close()


def test_two_nodes_serve_requests_handed_over_under_the_node_permissions(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The honest side: `shoal up` with two workers (a model split over both nodes, every service
    on its own identity): concurrent requests are handed to both nodes' ranks by the masters and
    served, and nothing any service does is refused by the server."""
    cluster = Cluster(tmp_path_factory.mktemp("handover"), workers=2)
    try:
        cluster.wait_ready()
        client = cluster.client()

        def ask(words: str) -> tuple[str, str | None]:
            reply = client.chat.completions.create(
                model="tiny", max_tokens=12, temperature=0, messages=[{"role": "user", "content": words}]
            )
            return reply.choices[0].message.content or "", reply.choices[0].finish_reason

        prompts = ["hello there", "the river stone", "a lantern at night", "hello there"]
        with ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(ask, prompts))
        state = asyncio.run(_whole_state(cluster))
        log_tail = cluster.up.tail(400_000)
    finally:
        cluster.stop()
    assert all(text and finish for text, finish in answers), answers
    assert answers[0] == answers[3]  # the same request, built alike from what was handed over
    assert "Permissions Violation" not in log_tail and "not handed" not in log_tail
    assert state.quarantined_count == 0, state.quarantined
    assert len(state.tasks) == len(prompts) and all(t.status == "completed" for t in state.tasks.values())
    for task in state.tasks.values():
        assert task.instance_id is not None
        assert len({rank.node_id for rank in state.instances[task.instance_id].runners}) == 2


async def _whole_state(cluster: Cluster) -> State:
    log = await EventLog.connect(cluster.admin_endpoint(), ensure=False)
    try:
        return await log.fold()
    finally:
        await log.close()
