"""Who may publish and read what on the bus, as the nats-server configuration that enforces it
(README "Security"). Pure: no I/O; `services/credentials.py` makes the keys and writes the files.

Identities (nkey users in one account; the server checks every PUB and SUB against them):

| identity | publishes | reads (JetStream consumers) |
|---|---|---|
| `admin` | everything, and manages streams | everything |
| `api` | `TaskCreated`, `TaskCancelled`, operators' `ModelLoadRequested`/`ModelUnloadRequested` | SHOAL_EVENTS, SHOAL_TELEMETRY |
| `master` | placement, assignment, retirement, watchdog, master-ended tasks, `ModelUnavailable`, `MasterProbe`; its lease key; answers to handover asks | both; its lease key; writes the snapshot object store; the handover asks |
| `worker-<node>` | its node's `NodeJoined`/`NodeLeft`/`LinkMeasured`/`NodeHeartbeat`; `RunnerStatusChanged` from its node | consumers filtered to nodes, instances (`NODE_READS`) |
| `runner-<node>` | from its node: prefill, chunks, `TaskCompleted`/`TaskFailed`, `RunnerStatusChanged`, `ModelDownloadProgress`, `RunnerHeartbeat`; handover asks on its node's subject | consumers filtered to placements, assignments, cancels, control-plane failures, its node's reports (`NODE_READS`) |
| `join` | a join request and the CA's certificate (`shoal.join.request`, `shoal.join.ca`) | its replies only |

"From its node": those kinds' subjects end with the publishing node when a node publishes them
(`events.subjects.NODE_PUBLISHED`), and a node identity may publish them only with its own node
there (`shoal.ev.task.*.chunk_generated.node-0` for `runner-node-0`); the control plane's copies
(a master's `TaskFailed`) end with their kind.

Reading is done through JetStream only: every identity but the admin may subscribe to its own
inbox (`_INBOX.<identity>.>`) and nothing else, so no one taps `shoal.>` live nor reads another
identity's replies and deliveries. What it may ask JetStream is read-only: stream info, message
get, creating and deleting its own (ephemeral) consumers, and answering flow control; the control
plane reads the State's snapshot (SHOAL_SNAPSHOTS), only the master writes it. A worker or runner
reads only what its node serves (`NODE_READS`): consumers filtered to one allowed subject each,
created by the request naming the filter; no message get, no snapshot, no task's request (the
masters hand a runner its tasks' requests on its node's subject: `events.handover`).

The server proves the publishing node, not more: which tasks and ranks that node serves is the
State's to say, so the fold holds each event's claimed origin to the node its subject names
(`events.subjects.route_refusal`) and to the State (`events.origins`: a rank of the task's
instance on that node; chunks and completions from the sampling rank only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal

import msgspec

from eventlog.streams import LEASE_BUCKET, MASTER_LEASE_KEY
from events.catalogue import (
    ChunkGenerated,
    ClusterStarted,
    Event,
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
)
from events.handover import handover_subject
from events.ids import check_token
from events.subjects import (
    CLUSTER_STARTED,
    EVENTS_STREAM,
    MASTER_PROBES,
    NODE_PUBLISHED,
    PREFIX,
    RUNNER_READS,
    SNAPSHOT_BUCKET,
    SNAPSHOT_STREAM,
    TELEMETRY_STREAM,
    WORKER_FAMILIES,
    instance_subject,
    node_subject,
    task_subject,
)
from services.nats_durability import JETSTREAM_SYNC_INTERVAL

Role = Literal["admin", "master", "api", "worker", "runner", "join"]
ROLES: tuple[Role, ...] = ("admin", "master", "api", "worker", "runner", "join")
PER_NODE: frozenset[Role] = frozenset({"worker", "runner"})
NODE = "{node}"  # stands for the identity's node in a subject pattern
ROUTE_USER = "shoal-route"
# A new machine's requests to join (`services/join_desk.py`): core NATS request/reply, outside
# the streams; only the `join` identity (whose seed is in every join token) and the admin that
# answers them use these subjects.
JOIN_REQUEST_SUBJECT = f"{PREFIX}.join.request"
JOIN_CA_SUBJECT = f"{PREFIX}.join.ca"

# The subject pattern of each event kind as the control plane publishes it (a node's copy of the
# kinds of NODE_PUBLISHED ends with its node: `subject_pattern`); tests/security checks each
# against `subject_for`.
SUBJECTS: Mapping[type[Event], str] = {
    ClusterStarted: CLUSTER_STARTED,  # the admin's (`shoal up`), like every subject
    NodeJoined: node_subject(NODE, "joined"),
    NodeLeft: node_subject(NODE, "left"),
    LinkMeasured: node_subject(NODE, "link_measured"),
    NodeTimedOut: node_subject("*", "timed_out"),
    InstancePlaced: instance_subject("*", "placed"),
    RunnerStatusChanged: instance_subject("*", "runner_status_changed"),
    InstanceRetired: instance_subject("*", "retired"),
    TaskCreated: task_subject("*", "created"),
    TaskAssigned: task_subject("*", "assigned"),
    PrefillStarted: task_subject("*", "prefill_started"),
    PrefillProgress: task_subject("*", "prefill_progress"),
    ChunkGenerated: task_subject("*", "chunk_generated"),
    TaskCancelled: task_subject("*", "cancelled"),
    TaskCompleted: task_subject("*", "completed"),
    TaskFailed: task_subject("*", "failed"),
    TaskStalled: task_subject("*", "stalled"),
    ModelDownloadProgress: f"{PREFIX}.ev.model.*.download_progress",
    ModelUnavailable: f"{PREFIX}.ev.model.*.unavailable",
    ModelLoadRequested: f"{PREFIX}.ev.model.*.load_requested",
    ModelUnloadRequested: f"{PREFIX}.ev.model.*.unload_requested",
    RunnerHeartbeat: f"{PREFIX}.hb.runner.*.*",
    NodeHeartbeat: f"{PREFIX}.hb.node.{NODE}",
    MasterProbe: MASTER_PROBES,
}

_DECISIONS = (
    *(TaskAssigned, TaskCompleted, TaskFailed, TaskStalled),
    *(InstancePlaced, InstanceRetired, NodeTimedOut, ModelUnavailable),
)
_RANK_REPORTS = (
    *(PrefillStarted, PrefillProgress, ChunkGenerated, TaskCompleted, TaskFailed, RunnerStatusChanged),
    ModelDownloadProgress,  # a rank downloads its node's copy of a Hub model
)
PUBLISHES: Mapping[Role, tuple[type[Event], ...]] = {
    "api": (TaskCreated, TaskCancelled, ModelLoadRequested, ModelUnloadRequested),  # models: admin keys only
    "master": (
        *_DECISIONS,
        MasterProbe,
    ),  # TaskCompleted: a task cancelled before assignment; TaskFailed: a retired queue
    "worker": (NodeJoined, NodeLeft, LinkMeasured, NodeHeartbeat, RunnerStatusChanged),  # status: a runner's exit
    "runner": (*_RANK_REPORTS, RunnerHeartbeat),
}

READS: Mapping[Role, tuple[str, ...]] = {  # whole streams: the control plane's
    "api": (EVENTS_STREAM, TELEMETRY_STREAM),  # telemetry: the /debug/timeline page
    "master": (EVENTS_STREAM, TELEMETRY_STREAM),  # telemetry: the watchdog's liveness
}

# What a node's identities may read of the events stream: consumers filtered to one of these
# subjects each (`events.subjects.WORKER_FAMILIES`, `RUNNER_READS`), and a runner its own node's
# reports (read back to tell whether a resend is stored); never a task's request or output (a
# runner is handed its tasks' requests: `events.handover`), nor the snapshot (the whole State).
NODE_READS: Mapping[Role, tuple[str, ...]] = {
    "worker": WORKER_FAMILIES,
    "runner": (*RUNNER_READS, f"{PREFIX}.ev.*.*.*.{NODE}"),
}
HANDOVER_ASKS = handover_subject("*", "*")  # the runners' asks for their requests, answered by the masters


class Identity(msgspec.Struct, frozen=True, order=True):
    """One user of the bus: a role, and for workers and runners the node they serve."""

    role: Role
    node: str = ""

    def __post_init__(self) -> None:
        if (self.role in PER_NODE) != bool(self.node):
            raise ValueError(f"a {self.role} identity {'needs' if self.role in PER_NODE else 'has no'} node")
        if self.node:
            check_token("node id", self.node)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.node}" if self.node else self.role

    @property
    def inbox_prefix(self) -> str:
        return f"_INBOX.{self.name}"

    @classmethod
    def parse(cls, name: str) -> Identity:
        """`master` -> Identity("master"); `worker-node-0` -> Identity("worker", "node-0")."""
        role, _, node = name.partition("-")
        for known in ROLES:
            if role == known:
                return cls(known, node)
        raise ValueError(f"{name!r} is not a shoal identity (one of {', '.join(ROLES)}, workers and runners -<node>)")


def node_identities(node: str) -> tuple[Identity, Identity]:
    """What a worker host needs: its worker and the runners it spawns."""
    return Identity("worker", node), Identity("runner", node)


CONTROL: tuple[Identity, ...] = (Identity("admin"), Identity("master"), Identity("api"))


def reader_api(stream: str) -> list[str]:
    """The JetStream requests a reader of `stream` makes (replay, follow, fold, get_last)."""
    api = "$JS.API"
    return [
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",  # flow control and stall replies of a push consumer
    ]


def node_reader_api(subjects: tuple[str, ...]) -> list[str]:
    """The JetStream requests a worker or runner makes on the events stream: consumers filtered to
    `subjects` only. Each create request names its filter (`eventlog.consume.create_subject`) and
    the server refuses one whose config asks another, so neither an unfiltered consumer, nor one
    with several filters, nor a message get (its subject is in the body, unchecked) is allowed."""
    api, stream = "$JS.API", EVENTS_STREAM
    return [
        f"{api}.STREAM.INFO.{stream}",
        *(f"{api}.CONSUMER.CREATE.{stream}.*.{subject}" for subject in subjects),
        f"{api}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def lease_api() -> list[str]:
    """What a master asks of the lease bucket (`services/master/lease.py`): read (from the stream's
    leader: the bucket has only the lease key) and compare-and-swap its one key. Creating the bucket is the admin's (`EventLog.ensure_streams`)."""
    stream, key = f"KV_{LEASE_BUCKET}", f"$KV.{LEASE_BUCKET}.{MASTER_LEASE_KEY}"
    return [key, f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}"]  # from the leader


def snapshot_api(role: Role) -> list[str]:
    """Every service starts from the State's snapshot (an object store: an unnamed ordered
    consumer reads its chunks); only the master writes it (chunks, meta, purge of the old chunks)."""
    # STREAM.NAMES: nats-py's object store looks the chunks' stream up by subject (names only).
    read = [*reader_api(SNAPSHOT_STREAM), f"$JS.API.CONSUMER.CREATE.{SNAPSHOT_STREAM}", "$JS.API.STREAM.NAMES"]
    if role != "master":
        return read
    return [*read, f"$O.{SNAPSHOT_BUCKET}.C.>", f"$O.{SNAPSHOT_BUCKET}.M.>", f"$JS.API.STREAM.PURGE.{SNAPSHOT_STREAM}"]


def subject_pattern(kind: type[Event], role: Role) -> str:
    """The subjects `role` publishes `kind` on, `NODE` standing for its node."""
    if role in PER_NODE and kind in NODE_PUBLISHED:
        return f"{SUBJECTS[kind]}.{NODE}"
    return SUBJECTS[kind]


def permissions(identity: Identity) -> dict[str, object]:
    """The identity's allow lists; everything else is refused by the server."""
    if identity.role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    if identity.role == "join":  # may only ask to join, and read the answers
        publish = [JOIN_REQUEST_SUBJECT, JOIN_CA_SUBJECT]
        return {"publish": {"allow": publish}, "subscribe": {"allow": [f"{identity.inbox_prefix}.>"]}}
    own = identity.node or "*"
    patterns = [subject_pattern(kind, identity.role) for kind in PUBLISHES[identity.role]]
    publish = [pattern.replace(NODE, own) for pattern in patterns]
    subscribe = [f"{identity.inbox_prefix}.>"]
    if identity.role in PER_NODE:
        publish += node_reader_api(tuple(subject.replace(NODE, own) for subject in NODE_READS[identity.role]))
    else:
        for stream in READS[identity.role]:
            publish += reader_api(stream)
        publish += snapshot_api(identity.role)
    if identity.role == "runner":
        publish.append(handover_subject(own, "*"))  # asks for its tasks' requests, on its node's subject
    if identity.role != "master":
        return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}
    publish += lease_api()
    # The masters answer the asks: each answer goes once to the asker's reply inbox.
    return {"publish": {"allow": publish}, "subscribe": {"allow": [*subscribe, HANDOVER_ASKS]}, "allow_responses": True}


class ClusterRoutes(msgspec.Struct, frozen=True, kw_only=True):
    """The routes of a NATS cluster: every server's `host:port`, and the password each must give."""

    name: str = "shoal"
    servers: tuple[str, ...]
    password: str

    def block(self, index: int) -> dict[str, object]:
        """The `cluster` block of server `index`: it listens on its own route's port, routes to all
        (to itself too: the server skips that one), and admits only routes that authenticate."""
        port = self.servers[index].rpartition(":")[2]
        credentials = f"{ROUTE_USER}:{self.password}"
        return {
            "name": self.name,
            "listen": f"0.0.0.0:{port}",
            "authorization": {"user": ROUTE_USER, "password": self.password},
            "routes": [f"nats://{credentials}@{server}" for server in self.servers],
        }


def server_config(users: Mapping[Identity, str], routes: ClusterRoutes | None = None, index: int = 0) -> str:
    """The nats-server configuration (JSON, which its parser reads) admitting `users`
    (identity -> public nkey), each with its permissions, and nobody else; with `routes`, that of
    cluster member `index`, whose routes authenticate too (`compose.nats.yaml`)."""
    entries = [
        {"nkey": public_key, "permissions": permissions(identity)} for identity, public_key in sorted(users.items())
    ]
    # The fsync policy too: a cluster member run from this file alone (compose) syncs like the
    # embedded server.
    config: dict[str, object] = {
        "authorization": {"users": entries},
        "jetstream": {"sync_interval": JETSTREAM_SYNC_INTERVAL},
    }
    if routes is not None:
        config["cluster"] = routes.block(index)
    return json.dumps(config, indent=2) + "\n"
