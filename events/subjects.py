"""Subject naming (docs/ARCHITECTURE.md §2). One function maps every event to its subject.

A subject says who may publish it (docs/ARCHITECTURE.md §11): the server checks every publish
against the identity's allow list, so whatever a subject names is vouched for by the server. The
kinds a node's worker or runner publishes about something that is not the node itself (a task, an
instance, a model, a rank's heartbeat) therefore end with the publishing node
(`...chunk_generated.<node>`), and `runner-<node>` / `worker-<node>` may publish only subjects
ending in their own node; `route_refusal` is how a reader holds an event's claimed origin to the
subject the server checked.
"""

from __future__ import annotations

import hashlib
import re
from typing import assert_never, get_args

from events.catalogue import (
    AnyEvent,
    ChunkGenerated,
    ClusterStarted,
    Event,
    InstancePlaced,
    InstanceRetired,
    LinkMeasured,
    LogEvent,
    MasterProbe,
    ModelDownloadProgress,
    ModelLoadRequested,
    ModelUnavailable,
    ModelUnloadRequested,
    NodeHeartbeat,
    NodeJoined,
    NodeLeft,
    NodeTimedOut,
    PrefillProgress,
    PrefillStarted,
    RunnerHeartbeat,
    RunnerStatusChanged,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
    tag_of,
    tag_of_kind,
)

PREFIX = "shoal"
EVENTS_STREAM = "SHOAL_EVENTS"
TELEMETRY_STREAM = "SHOAL_TELEMETRY"
SNAPSHOT_BUCKET = "SHOAL_SNAPSHOTS"  # the object store of the State's snapshots (eventlog/snapshots.py)
SNAPSHOT_STREAM = f"OBJ_{SNAPSHOT_BUCKET}"  # the stream behind it
EVENTS_SUBJECTS = f"{PREFIX}.ev.>"
TELEMETRY_SUBJECTS = f"{PREFIX}.hb.>"
MASTER_PROBES = f"{PREFIX}.hb.master"  # every master's probes: few and small, one subject


def task_subject(task_id: str, kind: str = "*") -> str:
    return f"{PREFIX}.ev.task.{task_id}.{kind}"


def task_events(task_id: str) -> str:
    """Everything about one task (what the API subscribes to before publishing TaskCreated)."""
    return f"{PREFIX}.ev.task.{task_id}.>"


CLUSTER_STARTED = f"{PREFIX}.ev.cluster.started"


def node_subject(node_id: str, kind: str = "*") -> str:
    return f"{PREFIX}.ev.node.{node_id}.{kind}"


def instance_subject(instance_id: str, kind: str = "*") -> str:
    return f"{PREFIX}.ev.instance.{instance_id}.{kind}"


_NOT_IN_TOKEN = re.compile(r"[^A-Za-z0-9_\-]")


def model_token(model: str) -> str:
    """A subject token for a model name (`mlx-community/x` or a path holds `/` and `.`): readable,
    and unique by a hash suffix, since two names may map to the same readable part."""
    digest = hashlib.sha256(model.encode()).hexdigest()[:8]
    return f"{_NOT_IN_TOKEN.sub('_', model)[-64:]}-{digest}"


def model_subject(model: str, kind: str = "*") -> str:
    return f"{PREFIX}.ev.model.{model_token(model)}.{kind}"


def model_subject_any() -> str:
    """Every model's events (a model name is not a token, so `model_subject` cannot take `*`)."""
    return f"{PREFIX}.ev.model.>"


def from_any_node(subject: str) -> list[str]:
    """A filter for `subject` (a pattern) as the control plane and as any node publish it: the
    node's copy ends with one more token (`NODE_PUBLISHED`)."""
    return [subject, f"{subject}.*"]


def is_telemetry_subject(subject: str) -> bool:
    return subject.startswith(f"{PREFIX}.hb.")


def subject_kind(event: AnyEvent) -> str:
    """The kind token of a subject: the tag without its family prefix (`task_cancelled` -> `cancelled`)."""
    return _KIND_TOKENS[type(event)]


def _kind_of_tag(tag: str) -> str:
    for family in ("task_", "node_", "instance_", "model_"):
        if tag.startswith(family):
            return tag.removeprefix(family)
    return tag


# Read once per kind: `__struct_config__` builds a new object on every access, microseconds that
# every subject_for (a publish, and the fold's subject check of every event) would pay.
_KIND_TOKENS: dict[type[Event], str] = {kind: _kind_of_tag(tag_of_kind(kind)) for kind in get_args(AnyEvent)}

TASK_EVENTS: tuple[type[LogEvent], ...] = (
    TaskCreated,
    TaskAssigned,
    PrefillStarted,
    PrefillProgress,
    ChunkGenerated,
    TaskCancelled,
    TaskCompleted,
    TaskFailed,
    TaskStalled,
)


# The kinds whose subject ends with the publishing node when a node (a worker or a runner: an
# origin with a node) publishes them; the same kinds published by the control plane (a master's
# TaskFailed) end with their kind, as every subject did before origins were bound to subjects.
NODE_PUBLISHED: frozenset[type[Event]] = frozenset(
    {
        PrefillStarted,
        PrefillProgress,
        ChunkGenerated,
        TaskCompleted,
        TaskFailed,
        RunnerStatusChanged,
        ModelDownloadProgress,
        RunnerHeartbeat,
    }
)


# What a node's identities read of the events stream, one consumer filtered to one of these
# subjects each (the only consumers the server lets them create: `services.nats_permissions`),
# never a task's request or output. A worker: nodes, and instances placed and retired (the runners
# to keep; not the ranks' statuses: a few per task, and each costs a worker a bounded read of its
# other families, `eventlog.families`). A runner: its placement, the assignments (ids only) in log
# order, every cancel and the control plane's failures (the others' end with their node); its
# request is handed over (`events.handover`).
WORKER_FAMILIES: tuple[str, ...] = (
    f"{PREFIX}.ev.node.>",
    instance_subject("*", "placed"),
    instance_subject("*", "retired"),
)
RUNNER_READS: tuple[str, ...] = (
    instance_subject("*", "placed"),
    task_subject("*", "assigned"),
    task_subject("*", "cancelled"),
    task_subject("*", "failed"),
)


def event_subjects_without(*skipped: type[LogEvent]) -> list[str]:
    """A consumer filter (JetStream `filter_subjects`) for the events stream that leaves out the
    task kinds `skipped`: a service with no use for per-token events (`ChunkGenerated`) is then
    never woken by them. Filters cannot exclude, so the kept subjects are listed, disjoint as
    JetStream requires; `tests/events/test_subjects.py` holds that every other kind matches one."""
    families = [node_subject("*"), f"{PREFIX}.ev.instance.>", model_subject_any()]
    tasks: list[str] = []
    for kind in TASK_EVENTS:
        if kind not in skipped:
            subject = task_subject("*", _KIND_TOKENS[kind])
            tasks += from_any_node(subject) if kind in NODE_PUBLISHED else [subject]
    return [*families, CLUSTER_STARTED, *tasks]


def subject_for(event: AnyEvent) -> str:
    """The subject `event` is published on; it ends with the publishing node for the kinds of
    `NODE_PUBLISHED` when the origin names one."""
    node = event.env.origin.node
    if node and type(event) in NODE_PUBLISHED:
        return f"{_control_subject(event)}.{node}"
    return _control_subject(event)


def route_refusal(subject: str | bytes, event: AnyEvent) -> str | None:
    """Why `event`, delivered on `subject`, is not what the server let its publisher send; None
    when it is. The subject must be `subject_for(event)`: the server checked it against the
    publisher's identity, so an event whose origin claims another node than the subject's (or
    another task, instance, node or kind) was forged by whoever may publish on that subject.

    One older layout is still taken: an event of a node published without the node token, as
    every event was before subjects named their publisher. The server lets no node identity
    publish those subjects any more (only the control plane: the master, and the admin that may
    publish anything), so an event found there comes from an older log or from the control plane,
    never from a node speaking for another."""
    got = subject if isinstance(subject, str) else subject.decode(errors="replace")
    if type(event) is ChunkGenerated or type(event) is PrefillProgress:
        # Most of a log, and read by every fold: `subject_for` built inline. Any other subject
        # (the older layout too) takes the general path below.
        node = event.env.origin.node
        kind = _KIND_TOKENS[type(event)]
        if got == (
            f"{PREFIX}.ev.task.{event.task_id}.{kind}.{node}" if node else f"{PREFIX}.ev.task.{event.task_id}.{kind}"
        ):
            return None
    expected = subject_for(event)
    if got == expected or (type(event) in NODE_PUBLISHED and got == _control_subject(event)):
        return None
    who = f"node {event.env.origin.node!r}" if event.env.origin.node else f"the {event.env.origin.service!r}"
    return f"{tag_of(event)} claiming {who} arrived on {got!r}; its subject is {expected!r}"


def _control_subject(event: AnyEvent) -> str:
    """The subject without the publishing node. The kinds most frequent in a log come first, and
    the subject is built inline: the fold computes it for every event it reads."""
    kind = _KIND_TOKENS[type(event)]
    match event:
        case ChunkGenerated() | PrefillProgress():
            return f"{PREFIX}.ev.task.{event.task_id}.{kind}"
        case (
            TaskCreated()
            | TaskAssigned()
            | PrefillStarted()
            | TaskCancelled()
            | TaskCompleted()
            | TaskFailed()
            | TaskStalled()
        ):
            return f"{PREFIX}.ev.task.{event.task_id}.{kind}"
        case NodeJoined() | NodeLeft() | NodeTimedOut() | LinkMeasured():
            return node_subject(event.node_id, kind)
        case InstancePlaced() | RunnerStatusChanged() | InstanceRetired():
            return instance_subject(event.instance_id, kind)
        case ModelDownloadProgress() | ModelUnavailable() | ModelLoadRequested() | ModelUnloadRequested():
            return model_subject(event.model, kind)
        case ClusterStarted():
            return CLUSTER_STARTED
        case RunnerHeartbeat():
            return f"{PREFIX}.hb.runner.{event.instance_id}.{event.rank}"
        case NodeHeartbeat():
            return f"{PREFIX}.hb.node.{event.node_id}"
        case MasterProbe():
            return MASTER_PROBES
        case _:
            assert_never(event)
