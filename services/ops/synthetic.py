"""Build consistent event logs with a controllable clock: for tests, the bench and demos.

`LogBuilder` stamps envelopes from its own clock and numbers both streams, so what it produces
folds cleanly and looks like an export. `simulate_prefill` plays the GPipe schedule of
docs/ARCHITECTURE.md §6 (rank r runs chunk k at iteration k + r) with 1 Hz heartbeats, and can
stop a rank at an iteration to produce the hangs `diagnose` must recognise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from events.catalogue import (
    AnyEvent,
    ChatMessage,
    ChunkGenerated,
    ClusterStarted,
    Envelope,
    InstancePlaced,
    InstanceRetired,
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
    Usage,
)
from events.codec import ExportRecord
from events.ids import EventId, InstanceId, NodeId, TaskId
from events.runner_settings import RunnerSettings
from events.vocabulary import CancelReason, FinishReason, Phase, RunnerStatus, RunnerStatusCause

START_NS = 1_767_225_600 * 1_000_000_000  # 2026-01-01T00:00:00Z
SECOND_NS = 1_000_000_000

# Stacks as the flight recorder formats them, innermost frame last. They name real code (file,
# function, source line); tests/test_stack_fixtures.py checks each frame against the source.
COLLECTIVE_STACK = (
    'File "runner/engine/prefill.py", line 39, in run_pipeline_prefill\n    if run.agree_to_stop("prefill", iteration):\n'
    'File "runner/engine/task_run.py", line 56, in agree_to_stop\n'
    "    stop = self.collectives.any(poll and self.wants_stop())\n"
    'File "runner/engine/collectives.py", line 53, in any\n    return self.agree([int(flag)])[0] > 0\n'
    'File "runner/engine/collectives.py", line 61, in agree\n'
    "    return [int(v) for v in cast(list[int], total.tolist())]\n"
)
COMPUTE_STACK = (
    'File "runner/engine/prefill.py", line 57, in compute_chunk\n    run.forward(piece if piece.ndim == 2 else piece[None])\n'
    'File "runner/engine/task_run.py", line 63, in forward\n'
    "    logits = self.model(tokens, cache=self.caches.slots)\n"
    'File "mlx_lm/models/llama.py", line 195, in __call__\n    h = layer(h, mask, cache=cache)\n'
)


class LogBuilder:
    """Appends events to an export with a clock you move by hand (`advance`)."""

    def __init__(self, sink: Callable[[ExportRecord], None] | None = None, start_ns: int = START_NS) -> None:
        self.records: list[ExportRecord] = []
        self._sink = sink if sink is not None else self.records.append
        self.now_ns = start_ns
        self.event_seq = 0
        self.telemetry_seq = 0
        self._ids = 0
        self._nodes_of: dict[str, Sequence[str]] = {}  # instance -> the node of each rank
        self._instance_of: dict[str, str] = {}  # task -> its instance

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * SECOND_NS)

    def _env(self, service: str, node: str = "", rank: int | None = None) -> Envelope:
        self._ids += 1
        origin = Origin(service=service, node=node, rank=rank)
        return Envelope(event_id=EventId(f"ev{self._ids}"), origin=origin, wall_time=self.now_ns, mono_ns=self.now_ns)

    def _rank_env(self, instance_id: str, rank: int) -> Envelope:
        """From the runner of `rank` on its node: the only origin the fold accepts (events.origins)."""
        nodes = self._nodes_of.get(instance_id, ())
        return self._env("runner", nodes[rank] if rank < len(nodes) else "", rank)

    def _task_rank_env(self, task_id: str, rank: int) -> Envelope:
        return self._rank_env(self._instance_of.get(task_id, ""), rank)

    def _sampling_env(self, task_id: str) -> Envelope:
        """From the task's last rank, the only one that reports tokens and ends a task."""
        instance_id = self._instance_of.get(task_id, "")
        return self._rank_env(instance_id, max(0, len(self._nodes_of.get(instance_id, ())) - 1))

    def record(self, event: AnyEvent) -> None:
        """Append an event made elsewhere (a master's decisions, stamped with this log's clock)."""
        self._emit(event)

    def _emit(self, event: AnyEvent) -> AnyEvent:
        if isinstance(event, RunnerHeartbeat):
            self.telemetry_seq += 1
            self._sink(ExportRecord(stream="telemetry", seq=self.telemetry_seq, event=event))
        else:
            self.event_seq += 1
            self._sink(ExportRecord(stream="events", seq=self.event_seq, event=event))
        return event

    # --- cluster -----------------------------------------------------------------------------

    def cluster_started(self, workers: int = 2, model: str = "tiny") -> None:
        """A `shoal up` began a run here (what came before belongs to earlier runs)."""
        self._emit(ClusterStarted(env=self._env("up"), workers=workers, model=model))

    def node_joined(self, node_id: str, host: str = "10.0.0.1", runner_logs: str = "") -> None:
        env = self._env("worker", node_id)
        nid = NodeId(node_id)
        self._emit(
            NodeJoined(
                env=env,
                node_id=nid,
                host=host,
                cores=8,
                memory_bytes=64 << 30,
                backend="cpu",
                version="0.1",
                runner_logs=runner_logs,
            )
        )

    def node_timed_out(self, node_id: str, last_seen_ns: int) -> None:
        self._emit(NodeTimedOut(env=self._env("master"), node_id=NodeId(node_id), last_seen=last_seen_ns))

    def node_left(self, node_id: str, reason: str = "shutdown") -> None:
        self._emit(NodeLeft(env=self._env("worker", node_id), node_id=NodeId(node_id), reason=reason))

    def retired(self, instance_id: str, reason: str) -> None:
        self._emit(InstanceRetired(env=self._env("master"), instance_id=InstanceId(instance_id), reason=reason))

    def instance_placed(self, instance_id: str, nodes: Sequence[str], model: str = "tiny", step: int = 1024) -> None:
        shards = [
            Shard(node_id=NodeId(node), rank=rank, start_layer=rank * 4, end_layer=rank * 4 + 4)
            for rank, node in enumerate(nodes)
        ]
        hosts = [f"10.0.0.{rank + 1}:5000" for rank in range(len(nodes))]
        env = self._env("master")
        iid = InstanceId(instance_id)
        self._nodes_of[instance_id] = tuple(nodes)
        settings = RunnerSettings(prefill_step_size=step)
        self._emit(
            InstancePlaced(env=env, instance_id=iid, model=model, shards=shards, ring_hosts=hosts, settings=settings)
        )

    def runner_status(
        self,
        instance_id: str,
        rank: int,
        status: RunnerStatus,
        detail: str = "",
        cause: RunnerStatusCause | None = None,
    ) -> None:
        nodes = self._nodes_of.get(instance_id, ())
        env = self._env("worker", nodes[rank] if rank < len(nodes) else "")  # the worker reports a runner's exit
        iid = InstanceId(instance_id)
        self._emit(RunnerStatusChanged(env=env, instance_id=iid, rank=rank, status=status, detail=detail, cause=cause))

    def ready_instance(self, instance_id: str, nodes: Sequence[str], model: str = "tiny", step: int = 1024) -> None:
        """Nodes joined, instance placed, every rank ready: the usual start of a log."""
        for node in nodes:
            self.node_joined(node)
        self.instance_placed(instance_id, nodes, model=model, step=step)
        for rank in range(len(nodes)):
            self.runner_status(instance_id, rank, "ready")

    # --- tasks -------------------------------------------------------------------------------

    def task_created(self, task_id: str, model: str = "tiny") -> None:
        messages = [ChatMessage(role="user", content="hello")]
        self._emit(TaskCreated(env=self._env("api"), task_id=TaskId(task_id), model=model, messages=messages))

    def task_assigned(self, task_id: str, instance_id: str) -> None:
        env = self._env("master")
        self._instance_of[task_id] = instance_id
        self._emit(TaskAssigned(env=env, task_id=TaskId(task_id), instance_id=InstanceId(instance_id)))

    def prefill_started(self, task_id: str, rank: int, chunks: int, step: int, pipeline: bool = True) -> None:
        path = "pipeline" if pipeline else "sequential"
        tokens = chunks * step + 1
        env = self._task_rank_env(task_id, rank)
        tid = TaskId(task_id)
        self._emit(
            PrefillStarted(env=env, task_id=tid, rank=rank, path=path, prompt_tokens=tokens, chunks=chunks, step=step)
        )

    def prefill_progress(self, task_id: str, rank: int, processed: int, total: int, iteration: int) -> None:
        env = self._task_rank_env(task_id, rank)
        tid = TaskId(task_id)
        self._emit(
            PrefillProgress(env=env, task_id=tid, rank=rank, processed=processed, total=total, iteration=iteration)
        )

    def chunk(self, task_id: str, index: int, tokens: int = 1) -> None:
        token_ids = list(range(index, index + tokens))
        self._emit(
            ChunkGenerated(
                env=self._sampling_env(task_id),
                task_id=TaskId(task_id),
                index=index,
                text="x" * tokens,
                token_ids=token_ids,
            )
        )

    def cancelled(self, task_id: str, reason: CancelReason = "client_disconnect") -> None:
        self._emit(TaskCancelled(env=self._env("api"), task_id=TaskId(task_id), reason=reason))

    def completed(self, task_id: str, finish_reason: FinishReason = "stop", tokens: int = 0) -> None:
        usage = Usage(completion_tokens=tokens)
        self._emit(
            TaskCompleted(
                env=self._sampling_env(task_id), task_id=TaskId(task_id), finish_reason=finish_reason, usage=usage
            )
        )

    def failed(self, task_id: str, error: str, rank: int | None = None) -> None:
        """A rank's own report when `rank` is given, else the master's (a task nobody can serve)."""
        env = self._task_rank_env(task_id, rank) if rank is not None else self._env("master")
        self._emit(TaskFailed(env=env, task_id=TaskId(task_id), error=error, rank=rank))

    def stalled(self, task_id: str, diagnosis: str) -> None:
        self._emit(TaskStalled(env=self._env("master"), task_id=TaskId(task_id), diagnosis=diagnosis))

    def heartbeat(
        self,
        instance_id: str,
        rank: int,
        phase: Phase,
        task_id: str | None = None,
        iteration: int = 0,
        phase_age_s: float = 0.0,
        stack: str | None = None,
        batch: Sequence[str] = (),
        kv: tuple[int, int] | None = None,
    ) -> None:
        env = self._rank_env(instance_id, rank)
        tid = TaskId(task_id) if task_id is not None else None
        event = RunnerHeartbeat(
            env=env,
            instance_id=InstanceId(instance_id),
            rank=rank,
            phase=phase,
            task_id=tid,
            iteration=iteration,
            phase_age_ms=int(phase_age_s * 1000),
            stack=stack,
            batch=[TaskId(t) for t in batch],
            kv_reserved_tokens=kv[0] if kv is not None else None,
            kv_capacity_tokens=kv[1] if kv is not None else None,
        )
        self._emit(event)


class PrefillPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One task's pipelined prefill as `simulate_prefill` plays it."""

    task_id: str
    instance_id: str
    world: int
    chunks: int
    step: int = 256
    iteration_s: float = 0.05
    heartbeat_s: float = 1.0
    heartbeats: bool = True  # False: a log exported without its telemetry stream
    stop_after_iteration: int | None = None  # the log of this prefill ends there (a wedge)


def simulate_prefill(log: LogBuilder, plan: PrefillPlan) -> bool:
    """Play the GPipe schedule; returns False when it stopped at `plan.stop_after_iteration`."""
    total = plan.chunks * plan.step + 1
    for rank in range(plan.world):
        log.prefill_started(plan.task_id, rank, plan.chunks, plan.step)
        log.prefill_progress(plan.task_id, rank, 0, total, -1)
    next_heartbeat = log.now_ns
    for iteration in range(plan.chunks + plan.world - 1):
        if plan.stop_after_iteration is not None and iteration > plan.stop_after_iteration:
            return False
        log.advance(plan.iteration_s)
        for rank in range(plan.world):
            chunk = iteration - rank
            if 0 <= chunk < plan.chunks:
                log.prefill_progress(plan.task_id, rank, (chunk + 1) * plan.step, total, iteration)
        if plan.heartbeats and log.now_ns >= next_heartbeat:
            for rank in range(plan.world):
                log.heartbeat(plan.instance_id, rank, "prefill", plan.task_id, iteration)
            next_heartbeat = log.now_ns + int(plan.heartbeat_s * SECOND_NS)
    for rank in range(plan.world):
        log.prefill_progress(plan.task_id, rank, total, total, plan.chunks + plan.world - 2)
    return True


def simulate_decode(log: LogBuilder, task_id: str, tokens: int, token_s: float = 0.02, per_chunk: int = 1) -> None:
    """The sampling rank streams `tokens` tokens, `per_chunk` per ChunkGenerated."""
    for index in range(0, tokens, per_chunk):
        log.advance(token_s * per_chunk)
        log.chunk(task_id, index, min(per_chunk, tokens - index))
