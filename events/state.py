"""The cluster State: what every process folds from the log (docs/ARCHITECTURE.md §4).

State and its parts are frozen. Maps are persistent (`immutables.Map`, a HAMT), so one event
costs O(log n) however many tasks the log holds — folding a million events stays fast.
`canonical_bytes` encodes a State with every map sorted by key, so two processes that folded
the same events produce identical bytes whatever their hash seeds.
"""

from __future__ import annotations

from typing import Any, Literal

import immutables
import msgspec

from events.catalogue import ChatMessage, PlacementHints, Shard, TaskParams, Usage
from events.ids import InstanceId, KeyId, NodeId, TaskId
from events.runner_settings import RunnerSettings
from events.vocabulary import (
    DOWN_STATUSES,
    SERVING_STATUSES,
    CancelReason,
    FinishReason,
    PrefillPath,
    RetireCause,
    RunnerStatus,
    RunnerStatusCause,
)

NodeStatus = Literal["up", "left", "timed_out"]
TaskStatus = Literal["created", "assigned", "prefilling", "decoding", "completed", "cancelled", "failed"]
ENDED_STATUSES: frozenset[str] = frozenset({"completed", "cancelled", "failed"})
RunnerState = RunnerStatus | Literal["placed"]  # "placed": no status reported yet


class NodeOutage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The newest time a node went away and came back. Kept while it is up again, so a task that
    its outage failed is still blamed on it (`events.culprit`) after the node recovered."""

    status: NodeStatus  # how it went away: "timed_out" or "left"
    reason: str
    at: int  # wall ns it went away (the event's stamp)
    back_at: int  # wall ns it was announced again
    at_seq: int = 0  # the log's seq of its going away: the order `events.culprit` judges by
    back_seq: int = 0  # the log's seq of its announcement


class LinkInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    rtt_us: int
    bytes_per_second: int
    at: int  # wall ns of the measurement (the event's stamp)


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    node_id: NodeId
    host: str
    cores: int
    memory_bytes: int  # what shoal may place here
    backend: str
    version: str
    host_memory_bytes: int = 0  # the machine's, shared with every node on `host`
    cached_models: tuple[str, ...] = ()  # Hub models in its cache (`/v1/models` lists them as servable)
    link_probe_port: int = 0
    runner_logs: str = ""  # where its runners' stderr files lie on `host` (`NodeJoined.runner_logs`)
    links: dict[NodeId, LinkInfo] = msgspec.field(default_factory=dict)  # to each peer, as it measured
    status: NodeStatus = "up"
    reason: str = ""
    changed_at: int = 0  # wall ns of the last status change (the announcing service's clock)
    changed_seq: int = 0  # the log's seq of the last status change: its order, on no one's clock
    last_outage: NodeOutage | None = None  # None: never went away since it first joined


class RunnerInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    rank: int
    node_id: NodeId
    status: RunnerState = "placed"
    detail: str = ""
    cause: RunnerStatusCause | None = None  # of the last status change (see RunnerStatusChanged)
    changed_at: int = 0
    changed_seq: int = 0  # the log's seq of the last status change (0: none since placed)

    @property
    def down(self) -> bool:
        return self.status in DOWN_STATUSES


class InstanceInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    instance_id: InstanceId
    model: str
    shards: tuple[Shard, ...]
    ring_hosts: tuple[str, ...]
    settings: RunnerSettings
    runners: tuple[RunnerInfo, ...]  # index = rank
    placed_seq: int
    placed_at: int
    queue: tuple[TaskId, ...] = ()  # assigned tasks not yet ended, in assignment order
    head_since: int = 0  # wall ns when queue[0] became the task the ranks are running
    retired: bool = False
    retire_reason: str = ""
    retire_cause: RetireCause | None = None
    retired_at: int = 0  # wall ns of the InstanceRetired
    retired_seq: int = 0  # its seq
    last_assigned_seq: int = 0  # seq of the newest task assigned to it
    became_ready_at: int = 0  # wall ns when every rank first reported ready; 0 = never
    last_busy_seq: int = 0  # seq of the last task assigned to it or ended on it (least recently used first)
    placement_reason: str = ""  # why the master put it there (`InstancePlaced.reason`)
    keep_alive_seconds: float | None = None  # the newest assigned task's `keep_alive`, if it gave one
    replaces: InstanceId | None = None  # the instance it takes over from (`InstancePlaced.replaces`)

    @property
    def world_size(self) -> int:
        return len(self.shards)

    @property
    def ready(self) -> bool:
        """Every rank warmed up (a running rank is also ready for the next task)."""
        return not self.retired and all(r.status in SERVING_STATUSES for r in self.runners)

    @property
    def failed(self) -> bool:
        return any(r.down for r in self.runners)


class RankProgress(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    processed: int
    total: int
    iteration: int
    at: int  # wall ns of the event


class RankPrefill(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    path: PrefillPath
    prompt_tokens: int
    chunks: int
    step: int
    started_at: int


class TaskInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    task_id: TaskId
    model: str
    messages: list[ChatMessage]
    params: TaskParams
    owner: KeyId = KeyId("")  # who may read and cancel it (with admins): see TaskCreated.owner
    status: TaskStatus = "created"
    created_seq: int = 0
    created_at: int = 0
    instance_id: InstanceId | None = None
    assigned_at: int = 0
    assigned_seq: int = 0
    prefill: dict[int, RankPrefill] = msgspec.field(default_factory=dict)  # by rank
    progress: dict[int, RankProgress] = msgspec.field(default_factory=dict)  # by rank
    first_token_at: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    text: str = ""
    cancel_reason: CancelReason | None = None
    cancelled_at: int = 0
    stalled: str = ""
    error: str = ""
    failed_rank: int | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    ended_at: int = 0
    ended_seq: int = 0
    last_activity_at: int = 0  # wall ns of the newest event about this task

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATUSES


class DownloadProgress(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    bytes_done: int
    bytes_total: int  # 0 = not known yet
    at: int  # wall ns of the event

    @property
    def finished(self) -> bool:
        return self.bytes_total > 0 and self.bytes_done >= self.bytes_total


class ModelStatus(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the log says about a model beyond its instances: downloads per node, and why the
    master could not place it (empty once it could)."""

    model: str
    downloads: dict[NodeId, DownloadProgress] = msgspec.field(default_factory=dict)  # by node, latest report
    unavailable: str = ""
    unavailable_at: int = 0
    # An operator's word on it (`ModelLoadRequested` / `ModelUnloadRequested`), newest first.
    pinned: bool = False  # never unloaded for idleness nor evicted
    load_requested_seq: int = 0  # seq of the newest load request; 0 = none
    unload_requested_seq: int = 0  # seq of the newest unload request; 0 = none
    hints: PlacementHints = msgspec.field(default_factory=PlacementHints)

    @property
    def unloaded(self) -> bool:
        """An operator unloaded it and has not loaded it since."""
        return self.unload_requested_seq > self.load_requested_seq


# How many ended tasks a State keeps whole by default (`ShoalConfig.finished_tasks_kept`).
FINISHED_TASKS_KEPT = 1000


class FinishedTasks(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The ended tasks, in the order they ended, as a persistent queue of ordinals (`events.retention`).

    Ordinals [kept_from, next) name tasks still whole in `State.tasks`; [first, kept_from) name
    tombstones: tasks whose payload left the State, remembered only so that a late event about one
    (a slow rank's chunk, a second terminal event) stays a harmless race and is not quarantined as
    an unknown task. Both spans hold at most `kept` entries, so memory does not grow with history.
    `kept` 0 keeps every ended task (no bound, no queue). Everything here is decided by the log's
    order, never a clock, so every replica folding the same log holds the same State.
    """

    kept: int = FINISHED_TASKS_KEPT
    order: immutables.Map[int, TaskId] = immutables.Map()  # ordinal -> task, for [first, next)
    evicted: immutables.Map[TaskId, int] = immutables.Map()  # tombstones: task -> its ordinal
    first: int = 0
    kept_from: int = 0
    next: int = 0


# How many quarantined events a State keeps (the newest); `State.quarantined_count` counts them all.
QUARANTINE_KEPT = 64


class Quarantined(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An event the fold refused (`events.apply.PoisonEvent`): skipped, never applied."""

    seq: int
    kind: str  # the event's tag, e.g. "task_cancelled"
    error: str  # the named error, e.g. "UnknownTask", "ForbiddenOrigin"
    reason: str


class State(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    last_seq: int = 0
    nodes: immutables.Map[NodeId, NodeInfo] = immutables.Map()
    instances: immutables.Map[InstanceId, InstanceInfo] = immutables.Map()
    tasks: immutables.Map[TaskId, TaskInfo] = immutables.Map()
    live_tasks: immutables.Map[TaskId, int] = immutables.Map()  # not ended: task -> created_seq (master's ticks)
    finished: FinishedTasks = FinishedTasks()
    models: immutables.Map[str, ModelStatus] = immutables.Map()  # only models some event is about
    # Part of the State (not a log line) so every replica that folds the same log agrees on it,
    # and `shoal diagnose` can report it; bounded so a flood of poison cannot grow it.
    quarantined: tuple[Quarantined, ...] = ()  # the newest QUARANTINE_KEPT, oldest first
    quarantined_count: int = 0

    @classmethod
    def starting_before(cls, seq: int, finished_tasks_kept: int = FINISHED_TASKS_KEPT) -> State:
        """An empty State that expects `seq` next (a stream whose head was trimmed by retention)."""
        return cls(last_seq=seq - 1, finished=FinishedTasks(kept=finished_tasks_kept))

    @classmethod
    def keeping(cls, finished_tasks_kept: int) -> State:
        """An empty State that keeps that many ended tasks whole (0: all of them)."""
        return cls(finished=FinishedTasks(kept=finished_tasks_kept))


def _sorted_maps(obj: Any) -> Any:
    if isinstance(obj, immutables.Map):
        return {key: obj[key] for key in sorted(obj.keys())}  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType, reportUnknownMemberType]
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


# Struct fields encode in declaration order and the small per-rank dicts in insertion order (the
# order of the events that filled them), so only the hash-ordered Maps need sorting.
_canonical = msgspec.json.Encoder(enc_hook=_sorted_maps)


def canonical_bytes(state: State) -> bytes:
    """Byte-stable JSON of a State: equal folds give equal bytes in any process."""
    return _canonical.encode(state)
