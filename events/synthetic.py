"""A deterministic, valid event history for tests and benchmarks (no I/O, no randomness).

`synthetic_history(n)` yields `n` events that fold without error: two nodes join, a 2-rank
instance is placed and warms up, then tasks run through their whole lifecycle (created,
assigned, prefill started and progressing on every rank, chunks generated, completed), with
an occasional cancel. Ids and clocks come from counters, so two calls give identical events.
"""

from __future__ import annotations

from collections.abc import Iterator

from events.catalogue import (
    ChatMessage,
    ChunkGenerated,
    InstancePlaced,
    LogEvent,
    NodeJoined,
    Origin,
    PrefillProgress,
    PrefillStarted,
    RunnerStatusChanged,
    Shard,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskParams,
    Usage,
)
from events.ids import InstanceId, NodeId, TaskId
from events.stamp import Stamper

_NODES = (NodeId("node-a"), NodeId("node-b"))
_INSTANCE = InstanceId("inst-synthetic")
_PREFILL_CHUNKS = 4
_DECODE_CHUNKS = 24


class _Counter:
    def __init__(self, start: int) -> None:
        self.value = start

    def __call__(self) -> int:
        self.value += 1
        return self.value


class _Stampers:
    """One stamper per publisher (each event carries the origin that may publish it,
    `events.origins`), all on the same counters, so the history stays one deterministic sequence."""

    def __init__(self, prefix: str) -> None:
        ids, wall, mono = _Counter(0), _Counter(1_700_000_000_000_000_000), _Counter(0)

        def stamper(origin: Origin) -> Stamper:
            return Stamper(origin, wall_ns=wall, mono_ns=mono, new_id=lambda: f"{prefix}-{ids():09d}")

        self.api = stamper(Origin(service="api"))
        self.master = stamper(Origin(service="master"))
        self.workers = {node: stamper(Origin(service="worker", node=node)) for node in _NODES}
        self.ranks = tuple(stamper(Origin(service="runner", node=node, rank=rank)) for rank, node in enumerate(_NODES))


def _cluster(st: _Stampers) -> Iterator[LogEvent]:
    for node in _NODES:
        yield NodeJoined(
            env=st.workers[node].stamp(),
            node_id=node,
            host=f"{node}.local",
            cores=8,
            memory_bytes=16 << 30,
            backend="cpu",
            version="0.1.0",
        )
    shards = [
        Shard(node_id=_NODES[0], rank=0, start_layer=0, end_layer=8),
        Shard(node_id=_NODES[1], rank=1, start_layer=8, end_layer=16),
    ]
    yield InstancePlaced(
        env=st.master.stamp(),
        instance_id=_INSTANCE,
        model="tiny",
        shards=shards,
        ring_hosts=["10.0.0.1:5000", "10.0.0.2:5000"],
    )
    for rank in (0, 1):
        yield RunnerStatusChanged(env=st.ranks[rank].stamp(), instance_id=_INSTANCE, rank=rank, status="ready")


def _task(st: _Stampers, number: int) -> Iterator[LogEvent]:
    task = TaskId(f"task-{number:08d}")
    messages = [ChatMessage(role="user", content=f"question number {number}")]
    yield TaskCreated(
        env=st.api.stamp(), task_id=task, model="tiny", messages=messages, params=TaskParams(max_tokens=64)
    )
    yield TaskAssigned(env=st.master.stamp(), task_id=task, instance_id=_INSTANCE)
    total = _PREFILL_CHUNKS * 128
    for rank in (0, 1):
        yield PrefillStarted(
            env=st.ranks[rank].stamp(),
            task_id=task,
            rank=rank,
            path="pipeline",
            prompt_tokens=total,
            chunks=_PREFILL_CHUNKS,
            step=128,
        )
    for chunk in range(1, _PREFILL_CHUNKS + 1):
        for rank in (0, 1):
            yield PrefillProgress(
                env=st.ranks[rank].stamp(),
                task_id=task,
                rank=rank,
                processed=chunk * 128,
                total=total,
                iteration=chunk + rank,
            )
    cancelled = number % 10 == 9
    for index in range(_DECODE_CHUNKS):
        yield ChunkGenerated(env=st.ranks[-1].stamp(), task_id=task, index=index, text=" tok", token_ids=[100 + index])
        if cancelled and index == _DECODE_CHUNKS // 2:
            yield TaskCancelled(env=st.api.stamp(), task_id=task, reason="client_disconnect")
            break
    finish = "cancelled" if cancelled else "length"
    usage = Usage(prompt_tokens=total, completion_tokens=_DECODE_CHUNKS, ttft_ms=12.5, prefill_tps=900.0)
    yield TaskCompleted(env=st.ranks[-1].stamp(), task_id=task, finish_reason=finish, usage=usage)


def synthetic_history(count: int, *, id_prefix: str = "ev") -> list[LogEvent]:
    """`count` events that fold cleanly from an empty State (the last task may be unfinished)."""
    st = _Stampers(id_prefix)
    out: list[LogEvent] = []
    source = _cluster(st)
    number = 0
    while len(out) < count:
        for event in source:
            out.append(event)
            if len(out) == count:
                break
        number += 1
        source = _task(st, number)
    return out


class FinishedTasks:
    """An endless supply of short finished tasks (created with a prompt and stop strings, assigned,
    one chunk of answer, completed) after the same cluster as `synthetic_history`: a long history
    for soak benches. Event ids stay unique across calls, so batches can be appended to one log."""

    def __init__(self, *, id_prefix: str = "soak", prompt_chars: int = 1000, answer_chars: int = 1000) -> None:
        self._st = _Stampers(id_prefix)
        self._number = 0
        self._prompt = "p" * prompt_chars
        self._answer = "a" * answer_chars

    def cluster(self) -> list[LogEvent]:
        """The nodes, the instance and its ready ranks: the first events of the log."""
        return list(_cluster(self._st))

    def next(self, count: int) -> list[LogEvent]:
        """The events of the next `count` tasks (4 each)."""
        out: list[LogEvent] = []
        for _ in range(count):
            self._number += 1
            task = TaskId(f"task-{self._number:08d}")
            messages = [ChatMessage(role="user", content=f"{self._number} {self._prompt}")]
            params = TaskParams(max_tokens=64, stop=["</answer>", "\n\nUser:"])
            out += [
                TaskCreated(env=self._st.api.stamp(), task_id=task, model="tiny", messages=messages, params=params),
                TaskAssigned(env=self._st.master.stamp(), task_id=task, instance_id=_INSTANCE),
                ChunkGenerated(env=self._st.ranks[-1].stamp(), task_id=task, index=0, text=self._answer, token_ids=[1]),
                TaskCompleted(env=self._st.ranks[-1].stamp(), task_id=task, finish_reason="stop", usage=Usage()),
            ]
        return out
