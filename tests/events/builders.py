"""Deterministic event builders for table tests: a fake clock and counter ids."""

from __future__ import annotations

import itertools
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
    RunnerHeartbeat,
    RunnerStatusChanged,
    Shard,
    TaskAssigned,
    TaskCreated,
)
from events.ids import InstanceId, KeyId, NodeId, TaskId
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


def fake_stamper(
    service: str = "test", clock: FakeClock | None = None, *, node: str = "n0", rank: int | None = None
) -> Stamper:
    counter: Iterator[int] = itertools.count(1)
    the_clock = clock if clock is not None else FakeClock()
    return Stamper(
        Origin(service=service, node=node, rank=rank),
        wall_ns=the_clock.wall,
        mono_ns=the_clock.mono,
        new_id=lambda: f"{service}-{next(counter)}",
    )


class Events:
    """Shorthands for the events most tests need, each stamped with the origin that publishes it
    (`events.origins`), all on one fake clock with one id counter.

    It remembers the instances it placed and the tasks it assigned, so a rank's report comes from
    that rank's runner on its node; `api`, `master`, `worker(node)` and `rank(...)` stamp by hand.
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self._ids: Iterator[int] = itertools.count(1)
        self._nodes_of: dict[str, tuple[str, ...]] = {}  # instance -> the node of each rank
        self._instance_of: dict[str, str] = {}  # task -> its instance
        self.api = self.stamper(Origin(service="api"))
        self.master = self.stamper(Origin(service="master"))

    def learn(self, event: LogEvent) -> None:
        """Remember a placement or an assignment made elsewhere (a master core's decision)."""
        if isinstance(event, InstancePlaced):
            nodes = tuple(shard.node_id for shard in sorted(event.shards, key=lambda shard: shard.rank))
            self._nodes_of.setdefault(event.instance_id, nodes)
        elif isinstance(event, TaskAssigned):
            self._instance_of.setdefault(event.task_id, event.instance_id)

    def stamper(self, origin: Origin) -> Stamper:
        return Stamper(origin, wall_ns=self.clock.wall, mono_ns=self.clock.mono, new_id=lambda: f"ev-{next(self._ids)}")

    def worker(self, node_id: str) -> Stamper:
        return self.stamper(Origin(service="worker", node=node_id))

    def rank(self, instance_id: str, rank: int) -> Stamper:
        """The runner of `rank` (default placement: nodes n1, n2 when the instance is unknown here)."""
        nodes = self._nodes_of.get(instance_id, ("n1", "n2"))
        return self.stamper(Origin(service="runner", node=nodes[rank % len(nodes)], rank=rank))

    def task_rank(self, task_id: str, rank: int | None = None) -> Stamper:
        """A runner of the task's instance: `rank`, or the sampling (last) rank."""
        instance = self._instance_of.get(task_id, "i1")
        last = len(self._nodes_of.get(instance, ("n1", "n2"))) - 1
        return self.rank(instance, last if rank is None else rank)

    def node(self, node_id: str = "n1", memory_gb: float = 16, host: str = "127.0.0.1") -> NodeJoined:
        return NodeJoined(
            env=self.worker(node_id).stamp(),
            node_id=NodeId(node_id),
            host=host,
            cores=2,
            memory_bytes=int(memory_gb * 2**30),
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
        placed = InstancePlaced(
            env=self.master.stamp(),
            instance_id=InstanceId(instance_id),
            model="tiny",
            shards=shards,
            ring_hosts=[f"127.0.0.1:{5000 + r}" for r in range(len(nodes))],
        )
        self.learn(placed)
        return placed

    def runner(self, rank: int, status: RunnerStatus, instance_id: str = "i1") -> RunnerStatusChanged:
        return RunnerStatusChanged(
            env=self.rank(instance_id, rank).stamp(), instance_id=InstanceId(instance_id), rank=rank, status=status
        )

    def heartbeat(
        self, instance_id: str, rank: int, phase: Phase, task_id: str | None = None, iteration: int = 0
    ) -> RunnerHeartbeat:
        tid = TaskId(task_id) if task_id is not None else None
        return RunnerHeartbeat(
            env=self.rank(instance_id, rank).stamp(),
            instance_id=InstanceId(instance_id),
            rank=rank,
            phase=phase,
            task_id=tid,
            iteration=iteration,
        )

    def created(self, task_id: str = "t1", model: str = "tiny", owner: str = "") -> TaskCreated:
        return TaskCreated(
            env=self.api.stamp(),
            task_id=TaskId(task_id),
            model=model,
            messages=[ChatMessage(role="user", content="hello")],
            owner=KeyId(owner),
        )

    def assigned(self, task_id: str = "t1", instance_id: str = "i1") -> TaskAssigned:
        assigned = TaskAssigned(env=self.master.stamp(), task_id=TaskId(task_id), instance_id=InstanceId(instance_id))
        self.learn(assigned)
        return assigned

    def started(self, task_id: str = "t1", rank: int = 0, chunks: int = 4) -> PrefillStarted:
        return PrefillStarted(
            env=self.task_rank(task_id, rank).stamp(),
            task_id=TaskId(task_id),
            rank=rank,
            path="pipeline",
            prompt_tokens=chunks * 128,
            chunks=chunks,
            step=128,
        )

    def progress(self, task_id: str = "t1", rank: int = 0, processed: int = 128, iteration: int = 1) -> PrefillProgress:
        return PrefillProgress(
            env=self.task_rank(task_id, rank).stamp(),
            task_id=TaskId(task_id),
            rank=rank,
            processed=processed,
            total=512,
            iteration=iteration,
        )

    def chunk(self, task_id: str = "t1", index: int = 0, text: str = "hi", tokens: int = 1) -> ChunkGenerated:
        return ChunkGenerated(
            env=self.task_rank(task_id).stamp(),
            task_id=TaskId(task_id),
            index=index,
            text=text,
            token_ids=list(range(tokens)),
        )
