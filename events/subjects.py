"""Subject naming (docs/ARCHITECTURE.md §2). One function maps every event to its subject."""

from __future__ import annotations

import hashlib
import re
from typing import assert_never

from events.catalogue import (
    AnyEvent,
    ChunkGenerated,
    ClusterStarted,
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
    return f"{PREFIX}.ev.model.*.*"


def is_telemetry_subject(subject: str) -> bool:
    return subject.startswith(f"{PREFIX}.hb.")


def subject_kind(event: AnyEvent) -> str:
    """The last subject token: the tag without its family prefix (`task_cancelled` -> `cancelled`)."""
    return _kind_of_tag(tag_of(event))


def _kind_of_tag(tag: str) -> str:
    for family in ("task_", "node_", "instance_", "model_"):
        if tag.startswith(family):
            return tag.removeprefix(family)
    return tag


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


def event_subjects_without(*skipped: type[LogEvent]) -> list[str]:
    """A consumer filter (JetStream `filter_subjects`) for the events stream that leaves out the
    task kinds `skipped`: a service with no use for per-token events (`ChunkGenerated`) is then
    never woken by them. Filters cannot exclude, so the kept subjects are listed, disjoint as
    JetStream requires; `tests/events/test_subjects.py` holds that every other kind matches one."""
    kinds = [_kind_of_tag(str(kind.__struct_config__.tag)) for kind in TASK_EVENTS if kind not in skipped]
    families = [node_subject("*"), instance_subject("*"), model_subject_any()]
    return [*families, CLUSTER_STARTED, *(task_subject("*", kind) for kind in kinds)]


def subject_for(event: AnyEvent) -> str:
    kind = subject_kind(event)
    match event:
        case (
            TaskCreated()
            | TaskAssigned()
            | PrefillStarted()
            | PrefillProgress()
            | ChunkGenerated()
            | TaskCancelled()
            | TaskCompleted()
            | TaskFailed()
            | TaskStalled()
        ):
            return task_subject(event.task_id, kind)
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
