"""The bus refuses what an identity may not do, and lets each do its job (README "Security").

Against a real nats-server configured as `shoal up` configures it: every refusal here is the
SERVER's (`-ERR 'Permissions Violation ...'` or `'Authorization Violation'`), and nothing refused
is stored.
"""

from __future__ import annotations

import nats.js.errors
import pytest

from eventlog.identity import NatsIdentity
from eventlog.log import EventLog, LogError
from eventlog.wire import Wire, WireClosed, WireError
from events.catalogue import (
    AnyEvent,
    ChatMessage,
    ChunkGenerated,
    ClusterStarted,
    InstancePlaced,
    InstanceRetired,
    LinkMeasured,
    MasterProbe,
    ModelDownloadProgress,
    ModelLoadRequested,
    ModelUnavailable,
    ModelUnloadRequested,
    NodeHeartbeat,
    NodeJoined,
    NodeLeft,
    NodeTimedOut,
    Origin,
    PrefillProgress,
    PrefillStarted,
    RunnerHeartbeat,
    RunnerStatusChanged,
    Shard,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
    TelemetryEvent,
    tag_of,
)
from events.codec import encode
from events.ids import InstanceId, NodeId, TaskId
from events.stamp import Stamper
from events.subjects import NODE_PUBLISHED, subject_for
from services.credentials import new_seed
from services.nats_permissions import NODE, PER_NODE, PUBLISHES, SUBJECTS, Identity, Role, subject_pattern
from tests.security.conftest import SecuredBus

TASK, INSTANCE, NODE_A = TaskId("task-1"), InstanceId("inst-1"), NodeId("node-a")
TEST_ORIGIN = Origin(service="test")
SERVICES = (Identity("api"), Identity("master"), Identity("worker", "node-a"), Identity("runner", "node-a"))


def one_of_each_kind(origin: Origin = TEST_ORIGIN) -> list[AnyEvent]:
    """One event of each kind, as `origin` would publish it (a node's end with its node)."""
    env = Stamper(origin).stamp
    shard = Shard(node_id=NODE_A, rank=0, start_layer=0, end_layer=8)
    return [
        NodeJoined(env=env(), node_id=NODE_A, host="h", cores=1, memory_bytes=1, backend="cpu", version="0"),
        NodeLeft(env=env(), node_id=NODE_A, reason="shutdown"),
        LinkMeasured(env=env(), node_id=NODE_A, peer=NodeId("node-b"), rtt_us=1, bytes_per_second=1),
        NodeTimedOut(env=env(), node_id=NODE_A, last_seen=1),
        InstancePlaced(env=env(), instance_id=INSTANCE, model="/etc", shards=[shard], ring_hosts=["h:1"]),
        RunnerStatusChanged(env=env(), instance_id=INSTANCE, rank=0, status="failed"),
        InstanceRetired(env=env(), instance_id=INSTANCE, reason="forged"),
        TaskCreated(env=env(), task_id=TASK, model="tiny", messages=[ChatMessage(role="user", content="secret")]),
        TaskAssigned(env=env(), task_id=TASK, instance_id=INSTANCE),
        PrefillStarted(env=env(), task_id=TASK, rank=0, path="sequential", prompt_tokens=1, chunks=1, step=1),
        PrefillProgress(env=env(), task_id=TASK, rank=0, processed=1, total=1, iteration=0),
        ChunkGenerated(env=env(), task_id=TASK, index=0, text="forged", token_ids=[1]),
        TaskCancelled(env=env(), task_id=TASK, reason="api"),
        TaskCompleted(env=env(), task_id=TASK, finish_reason="stop"),
        TaskFailed(env=env(), task_id=TASK, error="forged"),
        TaskStalled(env=env(), task_id=TASK, diagnosis="forged"),
        RunnerHeartbeat(env=env(), instance_id=INSTANCE, rank=0, phase="idle"),
        NodeHeartbeat(env=env(), node_id=NODE_A),
        MasterProbe(env=env(), master="master-a"),
        ModelDownloadProgress(env=env(), node_id=NODE_A, model="owner/name", bytes_done=1, bytes_total=2),
        ModelUnavailable(env=env(), model="owner/name", error="forged"),
        ModelLoadRequested(env=env(), model="owner/name", pinned=True),
        ModelUnloadRequested(env=env(), model="owner/name"),
        ClusterStarted(env=env(), workers=2, model="tiny"),
    ]


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, `>` the rest."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > index
        if index >= len(tokens) or token not in ("*", tokens[index]):
            return False
    return len(wanted) == len(tokens)


def origin_of(identity: Identity) -> Origin:
    """The origin `identity`'s service stamps (a runner: its rank, 0 here)."""
    return Origin(service=identity.role, node=identity.node, rank=0 if identity.role == "runner" else None)


@pytest.mark.parametrize("role", [role for role in PUBLISHES], ids=str)
def test_every_kind_has_a_permission_pattern_that_matches_its_subject(role: Role) -> None:
    identity = Identity(role, NODE_A if role in PER_NODE else "")
    samples = one_of_each_kind(origin_of(identity))
    assert {type(event) for event in samples} == set(SUBJECTS)
    for event in samples:
        pattern = subject_pattern(type(event), role).replace(NODE, NODE_A)
        assert matches(pattern, subject_for(event)), (tag_of(event), pattern)


def test_the_kinds_ending_with_the_node_are_those_nodes_publish_about_something_else() -> None:
    by_nodes = set(PUBLISHES["runner"]) | set(PUBLISHES["worker"])
    named_in_the_subject = {kind for kind in by_nodes if NODE in SUBJECTS[kind]}  # the node's own events
    assert by_nodes - named_in_the_subject == NODE_PUBLISHED


async def refusal(bus: SecuredBus, identity: Identity, *, publish: str = "", subscribe: str = "") -> str:
    """What the server says to `identity` publishing to / subscribing to a subject ("" = accepted)."""
    wire = await Wire.open(bus.url, identity=bus.identity(identity))
    try:
        if publish:
            wire.publish(publish.encode(), b"{}")
        if subscribe:
            wire.subscribe(subscribe)
        await wire.roundtrip()  # the server answers the PING after the PUB/SUB: any -ERR comes first
    except WireError as exc:
        return str(exc)
    finally:
        wire.close()
    return ""


async def test_a_client_without_an_admitted_identity_is_refused(bus: SecuredBus, tmp_path: object) -> None:
    with pytest.raises(WireClosed, match="Authorization Violation"):
        await Wire.open(bus.url)
    with pytest.raises(LogError, match="cannot connect"):
        await EventLog.connect(bus.url, wait_seconds=0.3)
    stranger = bus.directory.parent / "stranger.nk"
    stranger.write_bytes(new_seed())
    with pytest.raises(WireClosed, match="Authorization Violation"):
        await Wire.open(bus.url, identity=NatsIdentity(nkey_seed_file=str(stranger)))


CASES = [
    (identity, event)
    for identity in (*SERVICES, Identity("worker", "node-b"), Identity("runner", "node-b"))
    for event in one_of_each_kind(origin_of(identity))
]


def allowed(identity: Identity, event: AnyEvent) -> bool:
    if type(event) not in PUBLISHES[identity.role]:
        return False
    node_scoped = isinstance(event, NodeJoined | NodeLeft | LinkMeasured | NodeHeartbeat)
    return not node_scoped or event.node_id == identity.node


@pytest.mark.parametrize(
    ("identity", "event"),
    CASES,
    ids=[f"{i.name}-{tag_of(e)}-{'allowed' if allowed(i, e) else 'refused'}" for i, e in CASES],
)
async def test_each_identity_publishes_its_own_events_and_no_other(
    bus: SecuredBus, admin_log: EventLog, identity: Identity, event: AnyEvent
) -> None:
    """The forgeries of the issue are the refused cases: ChunkGenerated/TaskCompleted by the API
    or a worker, TaskCancelled by anyone but the API, RunnerStatusChanged by the API or the
    master, InstancePlaced by anyone but the master, another node's NodeJoined."""
    stream = "telemetry" if isinstance(event, TelemetryEvent) else "events"
    if allowed(identity, event):
        log = await EventLog.connect(bus.endpoint(identity))
        try:
            assert await log.append_many([event]) == [1]
        finally:
            await log.close()
        assert await admin_log.last_seq(stream) == 1
        return
    stored = await admin_log.last_seq(stream)  # 0 but once under load: compare with what it held before
    said = await refusal(bus, identity, publish=subject_for(event))
    assert f'Permissions Violation for Publish to "{subject_for(event)}"' in said
    assert await admin_log.last_seq(stream) == stored, "a refused event was stored"
    assert encode(event)  # the forgery was a well-formed event: only the permission stopped it


STREAM_ADMIN = ("DELETE", "PURGE", "UPDATE", "CREATE")


@pytest.mark.parametrize("identity", SERVICES, ids=lambda i: i.name)
async def test_only_the_admin_manages_streams(bus: SecuredBus, admin_log: EventLog, identity: Identity) -> None:
    for action in STREAM_ADMIN:
        subject = f"$JS.API.STREAM.{action}.SHOAL_EVENTS"
        assert f'Permissions Violation for Publish to "{subject}"' in await refusal(bus, identity, publish=subject)
    assert await admin_log.message_count() == 0  # still there, untouched
    await admin_log.delete_streams()  # the admin may
    with pytest.raises(nats.js.errors.NotFoundError):
        await admin_log.last_seq()
    await admin_log.ensure_streams()


@pytest.mark.parametrize("identity", SERVICES, ids=lambda i: i.name)
async def test_no_service_taps_the_bus_or_another_identitys_inbox(bus: SecuredBus, identity: Identity) -> None:
    """Prompts travel in TaskCreated and in deliveries to readers' inboxes: no service may
    subscribe to either; each reads the log through JetStream, into its own inbox only."""
    others = [other for other in SERVICES if other != identity]
    for subject in ("shoal.ev.task.*.created", "shoal.>", ">", "_INBOX.>", f"{others[0].inbox_prefix}.>"):
        said = await refusal(bus, identity, subscribe=subject)
        assert f'Permissions Violation for Subscription to "{subject}"' in said
    assert await refusal(bus, identity, subscribe=f"{identity.inbox_prefix}.mine") == ""


async def test_the_admin_may_watch_prompts_live(bus: SecuredBus, admin_log: EventLog) -> None:
    assert await refusal(bus, Identity("admin"), subscribe="shoal.ev.task.*.created") == ""


@pytest.mark.parametrize("identity", [Identity("worker", "node-a"), Identity("runner", "node-a")], ids=str)
async def test_workers_and_runners_do_not_read_telemetry(bus: SecuredBus, identity: Identity) -> None:
    subject = "$JS.API.CONSUMER.CREATE.SHOAL_TELEMETRY.peek"
    assert "Permissions Violation for Publish" in await refusal(bus, identity, publish=subject)


async def test_each_service_reads_what_its_job_needs(bus: SecuredBus, admin_log: EventLog) -> None:
    events = [e for e in one_of_each_kind() if not isinstance(e, TelemetryEvent | NodeTimedOut | NodeLeft)]
    await admin_log.append_many(events)
    beat = next(e for e in one_of_each_kind() if isinstance(e, RunnerHeartbeat))
    await admin_log.append_many([beat])
    logs = {identity: await EventLog.connect(bus.endpoint(identity)) for identity in SERVICES}
    try:
        for identity in (Identity("master"), Identity("api")):  # the control plane folds the whole log
            assert [event async for _, event in logs[identity].replay()] == events, identity.name
        # A node reads only by consumers filtered to what it serves (test_read_privilege.py).
        runner = logs[Identity("runner", "node-a")]
        placed = next(e for e in events if isinstance(e, InstancePlaced))
        assert await runner.get_last(subject_for(placed)) is not None  # its InstancePlaced
        assigned = [e async for _, e in runner.replay(subjects=["shoal.ev.task.*.assigned"])]
        assert [type(e) for e in assigned] == [TaskAssigned]
        for identity in (Identity("master"), Identity("api")):  # the watchdog, /debug/timeline
            assert [e async for _, e in logs[identity].replay(stream="telemetry")] == [beat]
            assert await logs[identity].last_seq("telemetry") == 1
    finally:
        for log in logs.values():
            await log.close()


NODE_IDENTITIES = (Identity("worker", "node-a"), Identity("runner", "node-a"))
FORGERIES = [
    (identity, event)
    for identity in NODE_IDENTITIES
    for event in one_of_each_kind(Origin(service=identity.role, node="node-b", rank=1))
    if type(event) in PUBLISHES[identity.role] and type(event) in NODE_PUBLISHED
]


@pytest.mark.parametrize(
    ("identity", "event"), FORGERIES, ids=[f"{i.name}-as-node-b-{tag_of(e)}" for i, e in FORGERIES]
)
async def test_a_node_cannot_publish_as_another_node(
    bus: SecuredBus, admin_log: EventLog, identity: Identity, event: AnyEvent
) -> None:
    """node-a's runner forging node-b's rank 1 (chunks, a completion, its status...), node-a's
    worker reporting node-b's runner: on node-b's subject, or on the control plane's (no node),
    the server refuses; only node-a's subjects are open to node-a."""
    stream = "telemetry" if isinstance(event, TelemetryEvent) else "events"
    stored = await admin_log.last_seq(stream)
    as_node_b = subject_for(event)
    assert as_node_b.endswith(".node-b")
    for subject in (as_node_b, as_node_b.removesuffix(".node-b")):
        said = await refusal(bus, identity, publish=subject)
        assert f'Permissions Violation for Publish to "{subject}"' in said
    assert await admin_log.last_seq(stream) == stored, "a refused event was stored"
