"""The event catalogue (docs/ARCHITECTURE.md §2): every fact about the cluster as a typed, frozen struct.

Rules for changing this file without breaking the wire or old logs:
- tags are explicit snake_case strings: renaming a class never changes the wire;
- new fields get defaults; a field's type never changes;
- `LogEvent` (stream SHOAL_EVENTS) and `TelemetryEvent` (stream SHOAL_TELEMETRY) are closed
  unions: adding a kind means adding it to the union, to `subjects.subject_for` and to
  `apply.apply` (basedpyright and `assert_never` point at every place).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from events.ids import EventIdField, InstanceIdField, KeyId, NodeIdField, TaskId, TaskIdField
from events.logprobs import TokenLogprob
from events.runner_settings import RunnerSettings
from events.task_params import TaskParams
from events.vocabulary import (
    CancelReason,
    FinishReason,
    JoinCause,
    Phase,
    PrefillPath,
    RetireCause,
    RunnerStatus,
    RunnerStatusCause,
)


class Origin(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Who published an event: a service on a node, and the rank for runner events."""

    service: str
    node: str = ""
    rank: int | None = None


class Envelope(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Carried by every event. The stream sequence is attached on read, never stored here."""

    event_id: EventIdField  # also the Nats-Msg-Id, so a retried publish is stored once
    origin: Origin
    wall_time: int  # unix ns
    mono_ns: int  # publisher's monotonic clock, for durations within one process


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    env: Envelope


# --- shared value types (the literals live in events.vocabulary) ----------------------------


class Shard(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    node_id: NodeIdField
    rank: int
    start_layer: int  # inclusive
    end_layer: int  # exclusive
    # Bytes the master reserved on the node for this rank (its layers' weights and their KV room);
    # what placement counts as held there. 0 in logs written before placement counted memory.
    memory_bytes: int = 0


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A function call an assistant made, as OpenAI carries it (`arguments` is JSON text)."""

    id: str
    name: str
    arguments: str


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)  # an assistant's calls, replayed
    tool_call_id: str | None = None  # a tool result: the call it answers


# A raw prompt (`/v1/completions`): text, encoded as the tokenizer does without a chat template, or
# token ids taken as they are.
RawPrompt = str | list[int]


class Usage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache (OpenAI's prompt_tokens_details)


# --- cluster --------------------------------------------------------------------------------


class NodeJoined(Event, tag="node_joined", frozen=True, kw_only=True):
    """The node is up: its worker says so, at start and whenever it learns the log may think
    otherwise (`cause`). A timed-out node comes back this way, not by a master decision: the
    worker that announces is the one that folds the log and runs what is placed on it, so its
    announcement proves more than a heartbeat (which only proves telemetry gets through), and
    it needs no clock. Every reader (placement, `/healthz`, the dashboard, diagnose, the bus
    permissions) already takes `NodeJoined` as "up", so a recovery needs no new kind. A re-announce
    answering a timeout carries an id derived from that timeout, so it is stored once."""

    node_id: NodeIdField
    host: str
    cores: int
    memory_bytes: int  # what shoal may place on this node (`node_memory_bytes`, else the host's memory)
    backend: str  # "cpu", "metal", "cuda"
    version: str
    cause: JoinCause = "start"  # logs written before re-announces existed hold only starts
    # The machine's memory, shared by every node on `host` (several workers of one `shoal up`):
    # placement never reserves more than this on one host. 0 in older logs: `memory_bytes`.
    host_memory_bytes: int = 0
    cached_models: list[str] = msgspec.field(default_factory=list)  # Hub models in its cache: servable at once
    link_probe_port: int = 0  # where peers measure their link to it (`LinkMeasured`); 0 = none
    # The directory on its host where the worker keeps each runner's stderr
    # (`<instance>.rank<r>.log`, `services/worker/runner_logs.py`); "" = none (older logs).
    runner_logs: str = ""


class LinkMeasured(Event, tag="link_measured", frozen=True, kw_only=True):
    """What `node_id`'s worker measured of its link to `peer` (round trip of a small message, and
    the rate of a bulk send): the master orders an instance's ring along the fastest links."""

    node_id: NodeIdField
    peer: NodeIdField
    rtt_us: int
    bytes_per_second: int


class NodeLeft(Event, tag="node_left", frozen=True, kw_only=True):
    node_id: NodeIdField
    reason: str


class NodeTimedOut(Event, tag="node_timed_out", frozen=True, kw_only=True):
    node_id: NodeIdField
    last_seen: int  # unix ns on the master's clock when it last heard the node (never the sender's)


class InstancePlaced(Event, tag="instance_placed", frozen=True, kw_only=True):
    instance_id: InstanceIdField
    model: str
    shards: list[Shard]
    ring_hosts: list[str]  # "host:port" of each rank, index = rank
    # What every rank runs with. Logs written before it carried prefill_step_size, kv_bits and
    # kv_group_size flat here: those decode with the default settings (upgrading restarts the
    # nodes, and a node that leaves retires its instances, so none is served from them again).
    settings: RunnerSettings = msgspec.field(default_factory=RunnerSettings)
    # Why the master chose these nodes and this split, for people (`shoal placement explain`).
    reason: str = ""
    # The instance this one takes over from (placed on fewer nodes): once this one is ready, that one
    # takes no new task and is retired when it holds none.
    replaces: InstanceIdField | None = None


class RunnerStatusChanged(Event, tag="runner_status_changed", frozen=True, kw_only=True):
    instance_id: InstanceIdField
    rank: int
    status: RunnerStatus
    detail: str = ""  # for people: an error, an exit, a stderr tail; code reads `cause`
    # Why a runner went down (failed/stopped); None for the other statuses, and in logs written
    # before causes existed. `peer_lost` marks a casualty: the master waits to name the culprit.
    cause: RunnerStatusCause | None = None


class InstanceRetired(Event, tag="instance_retired", frozen=True, kw_only=True):
    instance_id: InstanceIdField
    reason: str
    cause: RetireCause | None = None  # None in logs from before it existed


class ClusterStarted(Event, tag="cluster_started", frozen=True, kw_only=True):
    """`shoal up` began a run on this log (which outlives it): a live diagnosis of "now" starts
    here, and what came before belongs to earlier runs (`services/ops/runs.py`)."""

    workers: int = 0
    model: str = ""


# --- models ---------------------------------------------------------------------------------


class ModelDownloadProgress(Event, tag="model_download_progress", frozen=True, kw_only=True):
    """A rank on `node_id` is downloading `model` (a Hub id) into its node's cache; published at a
    bounded rate, and once more when done (bytes_done == bytes_total)."""

    node_id: NodeIdField
    model: str
    bytes_done: int = 0
    bytes_total: int = 0  # 0 while huggingface_hub does not know the total yet


class PlacementHints(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An operator's constraints on where a model's instance goes (`shoal models load`)."""

    nodes: list[NodeIdField] = msgspec.field(default_factory=list)  # only these nodes; empty = any
    min_nodes: int = 1  # split over at least this many nodes
    max_nodes: int = 0  # and at most this many; 0 = as many as it needs


class ModelLoadRequested(Event, tag="model_load_requested", frozen=True, kw_only=True):
    """An operator asked for `model` to be placed (and kept placed while `pinned`: never unloaded
    for idleness nor evicted), through the admin API or `shoal models load`."""

    model: str
    pinned: bool = False
    hints: PlacementHints = msgspec.field(default_factory=PlacementHints)


class ModelUnloadRequested(Event, tag="model_unload_requested", frozen=True, kw_only=True):
    """An operator asked for `model`'s instances to be retired once they finish the tasks they
    hold (and unpinned); a later request for the model places it again."""

    model: str


class ModelUnavailable(Event, tag="model_unavailable", frozen=True, kw_only=True):
    """The master cannot place `model`: it cannot read its layer count (not a model directory,
    or a Hub id neither cached nor downloadable). `error` says what to do."""

    model: str
    error: str


# --- task lifecycle -------------------------------------------------------------------------


class TaskCreated(Event, tag="task_created", frozen=True, kw_only=True):
    task_id: TaskIdField
    model: str
    messages: list[ChatMessage]
    params: TaskParams = msgspec.field(default_factory=TaskParams)
    owner: KeyId = KeyId("")  # the API key that created it, by id; "" when the API ran without keys
    # Set by `/v1/completions`: the prompt as it is, without the chat template (`messages` is then
    # empty). None in chat tasks and in logs written before completions existed.
    prompt: RawPrompt | None = None


class TaskAssigned(Event, tag="task_assigned", frozen=True, kw_only=True):
    task_id: TaskIdField
    instance_id: InstanceIdField


class PrefillStarted(Event, tag="prefill_started", frozen=True, kw_only=True):
    task_id: TaskIdField
    rank: int
    path: PrefillPath
    prompt_tokens: int
    chunks: int
    step: int
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache; `chunks` cover the rest


class PrefillProgress(Event, tag="prefill_progress", frozen=True, kw_only=True):
    task_id: TaskIdField
    rank: int
    processed: int
    total: int
    iteration: int


class ChunkGenerated(Event, tag="chunk_generated", frozen=True, kw_only=True):
    task_id: TaskIdField
    index: int  # index of the first token of this chunk in its choice's completion
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the task asked for them
    choice: int = 0  # which of the task's `n` completions it belongs to (`TaskParams.n`)


class TaskCancelled(Event, tag="task_cancelled", frozen=True, kw_only=True):
    task_id: TaskIdField
    reason: CancelReason


class ChoiceEnd(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How one of a task's `n` completions ended (`TaskCompleted.choices`)."""

    index: int
    finish_reason: FinishReason
    completion_tokens: int
    stop_sequence: str | None = None


class TaskCompleted(Event, tag="task_completed", frozen=True, kw_only=True):
    task_id: TaskIdField
    finish_reason: FinishReason  # choice 0's, when the task has several
    usage: Usage = msgspec.field(default_factory=Usage)  # completion_tokens: all choices' together
    stop_sequence: str | None = None  # the request's stop string that ended it ("stop"), if one did
    # A task of `n` > 1 completions: one per choice, by index (choice 0's repeats the fields above);
    # empty for one completion.
    choices: list[ChoiceEnd] = msgspec.field(default_factory=list)


class TaskFailed(Event, tag="task_failed", frozen=True, kw_only=True):
    task_id: TaskIdField
    error: str
    rank: int | None = None
    deadline: bool = False  # the master ended it at its request deadline (request_timeout_seconds)
    invalid_request: bool = False  # the runners refused the request itself (the client's to change, not retry)


class TaskStalled(Event, tag="task_stalled", frozen=True, kw_only=True):
    task_id: TaskIdField
    diagnosis: str


# --- flight recorder (stream SHOAL_TELEMETRY) ------------------------------------------------


class RunnerHeartbeat(Event, tag="runner_heartbeat", frozen=True, kw_only=True):
    instance_id: InstanceIdField
    rank: int
    phase: Phase
    task_id: TaskIdField | None = None  # the task the phase is about (under batching: the batch's first)
    iteration: int = 0
    phase_age_ms: int = 0
    stack: str | None = None
    batch: list[TaskIdField] = msgspec.field(default_factory=list)  # every task the rank is running
    # Its batch's KV: positions the members reserve (prompt + max_tokens, padded to the longest) and
    # what the instance holds (the least over its ranks); None when it does not batch.
    kv_reserved_tokens: int | None = None
    kv_capacity_tokens: int | None = None

    @property
    def tasks(self) -> tuple[TaskId, ...]:
        """Every task this beat is about: the batch, or the one task of a beat without one (a rank
        serving one task at a time, or a log from before batching)."""
        if self.batch:
            return tuple(self.batch)
        return () if self.task_id is None else (self.task_id,)


class NodeHeartbeat(Event, tag="node_heartbeat", frozen=True, kw_only=True):
    node_id: NodeIdField
    free_memory_bytes: int = 0
    runners: int = 0


class MasterProbe(Event, tag="master_probe", frozen=True, kw_only=True):
    """A master's note to itself, sent each tick on the heartbeats' path: read back promptly, it
    proves the master heard every heartbeat stored before it (`services.master.sight`), so a
    master whose own reading stalled never takes that for the nodes' silence. `env.wall_time`
    is when it was sent, on the only clock that reads it back."""

    master: str  # the sender's name (its lease holder name): each master counts its own probes


LogEvent = (
    NodeJoined
    | LinkMeasured
    | ClusterStarted
    | NodeLeft
    | NodeTimedOut
    | InstancePlaced
    | RunnerStatusChanged
    | InstanceRetired
    | ModelDownloadProgress
    | ModelUnavailable
    | ModelLoadRequested
    | ModelUnloadRequested
    | TaskCreated
    | TaskAssigned
    | PrefillStarted
    | PrefillProgress
    | ChunkGenerated
    | TaskCancelled
    | TaskCompleted
    | TaskFailed
    | TaskStalled
)
TelemetryEvent = RunnerHeartbeat | NodeHeartbeat | MasterProbe
AnyEvent = LogEvent | TelemetryEvent


def tag_of(event: AnyEvent) -> str:
    """The wire tag of an event (`task_created`, ...); also the kind token of its subject."""
    return tag_of_kind(type(event))


def tag_of_kind(kind: type[Event]) -> str:
    """The wire tag of an event kind."""
    tag = kind.__struct_config__.tag
    if not isinstance(tag, str):  # pragma: no cover - every concrete event has a str tag
        raise TypeError(f"{kind.__name__} has no string tag")
    return tag
