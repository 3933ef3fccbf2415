"""Deterministic event builders for table tests: a fake clock and counter ids."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from events.catalogue import (
    ChatMessage,
    ChunkGenerated,
    InstancePlaced,
    NodeJoined,
    Origin,
    PrefillProgress,
    PrefillStarted,
    RunnerHeartbeat,
    RunnerStatusChanged,
    Shard,
    TaskAssigned,
    TaskCreated,
)
from events.ids import InstanceId, NodeId, TaskId
from events.stamp import Stamper
from events.vocabulary import Phase, RunnerStatus


class FakeClock:
    """Wall and monotonic time that only move when told to."""

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self.now_ns = start_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)

    def wall(self) -> int:
        return self.now_ns

    def mono(self) -> int:
        return self.now_ns


def fake_stamper(service: str = "test", clock: FakeClock | None = None) -> Stamper:
    counter: Iterator[int] = itertools.count(1)
    the_clock = clock if clock is not None else FakeClock()
    return Stamper(
        Origin(service=service, node="n0"),
        wall_ns=the_clock.wall,
        mono_ns=the_clock.mono,
        new_id=lambda: f"{service}-{next(counter)}",
    )


class Events:
    """Shorthands for the events most tests need, all stamped by one fake stamper."""

    def __init__(self, stamper: Stamper | None = None) -> None:
        self.stamper = stamper if stamper is not None else fake_stamper()

    def node(self, node_id: str = "n1", memory_gb: int = 16) -> NodeJoined:
        return NodeJoined(
            env=self.stamper.stamp(),
            node_id=NodeId(node_id),
            host="127.0.0.1",
            cores=2,
            memory_bytes=memory_gb * 2**30,
            backend="cpu",
            version="test",
        )

    def placed(self, instance_id: str = "i1", nodes: tuple[str, ...] = ("n1", "n2"), layers: int = 8) -> InstancePlaced:
        per = layers // len(nodes)
        shards = [
            Shard(
                node_id=NodeId(n),
                rank=r,
                start_layer=r * per,
                end_layer=layers if r == len(nodes) - 1 else (r + 1) * per,
            )
            for r, n in enumerate(nodes)
        ]
        return InstancePlaced(
            env=self.stamper.stamp(),
            instance_id=InstanceId(instance_id),
            model="tiny",
            shards=shards,
            ring_hosts=[f"127.0.0.1:{5000 + r}" for r in range(len(nodes))],
        )

    def runner(self, rank: int, status: RunnerStatus, instance_id: str = "i1") -> RunnerStatusChanged:
        return RunnerStatusChanged(
            env=self.stamper.stamp(), instance_id=InstanceId(instance_id), rank=rank, status=status
        )

    def heartbeat(self, instance_id: str, rank: int, phase: Phase, task_id: str | None = None) -> RunnerHeartbeat:
        tid = TaskId(task_id) if task_id is not None else None
        return RunnerHeartbeat(
            env=self.stamper.stamp(), instance_id=InstanceId(instance_id), rank=rank, phase=phase, task_id=tid
        )

    def created(self, task_id: str = "t1", model: str = "tiny") -> TaskCreated:
        return TaskCreated(
            env=self.stamper.stamp(),
            task_id=TaskId(task_id),
            model=model,
            messages=[ChatMessage(role="user", content="hello")],
        )

    def assigned(self, task_id: str = "t1", instance_id: str = "i1") -> TaskAssigned:
        return TaskAssigned(env=self.stamper.stamp(), task_id=TaskId(task_id), instance_id=InstanceId(instance_id))

    def started(self, task_id: str = "t1", rank: int = 0, chunks: int = 4) -> PrefillStarted:
        return PrefillStarted(
            env=self.stamper.stamp(),
            task_id=TaskId(task_id),
            rank=rank,
            path="pipeline",
            prompt_tokens=chunks * 128,
            chunks=chunks,
            step=128,
        )

    def progress(self, task_id: str = "t1", rank: int = 0, processed: int = 128, iteration: int = 1) -> PrefillProgress:
        return PrefillProgress(
            env=self.stamper.stamp(),
            task_id=TaskId(task_id),
            rank=rank,
            processed=processed,
            total=512,
            iteration=iteration,
        )

    def chunk(self, task_id: str = "t1", index: int = 0, text: str = "hi", tokens: int = 1) -> ChunkGenerated:
        return ChunkGenerated(
            env=self.stamper.stamp(), task_id=TaskId(task_id), index=index, text=text, token_ids=list(range(tokens))
        )
