"""What the masters' tests put around real masters on a real log: the API's requests and the
ranks' answers, published as those services publish them (each with its own origin), and a count
of the decisions the log stored.

The ranks here do no compute: a placed instance reports every rank ready, an assigned task is
completed by its last rank. The fail-over tests are about who decides, not about inference.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Sequence

import msgspec

from eventlog.log import EventLog
from events.catalogue import (
    AnyEvent,
    InstancePlaced,
    LogEvent,
    TaskAssigned,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
)
from events.ids import TaskId
from services.master.capacity import ModelFacts
from services.master.core import MasterPolicy, UnknownModel
from tests.events.builders import Events, FakeClock

NODES = ("n1", "n2")
POLICY = MasterPolicy(node_timeout_seconds=600.0)  # no heartbeats here: nodes must not time out


TINY_FACTS = ModelFacts(layers=8, weight_bytes=64 << 20)


class Catalog:
    def facts_of(self, model: str) -> ModelFacts:
        if model != "tiny":
            raise UnknownModel(f"unknown model {model!r}; known models: tiny")
        return TINY_FACTS


class LiveEvents(Events):
    """The builders of `tests.events.builders`, stamped with the wall clock (the watchdog reads it)."""

    def __init__(self) -> None:
        super().__init__(FakeClock(time.time_ns()))

    def now(self) -> LiveEvents:
        self.clock.now_ns = time.time_ns()
        return self


async def simulate_ranks(log: EventLog, ev: LiveEvents) -> None:
    """Answer every placement with ready ranks and every assignment with a completion, forever."""
    async for _seq, event in log.follow(from_seq=1):
        if isinstance(event, InstancePlaced):
            ev.learn(event)
            await log.append_many([ev.now().runner(s.rank, "ready", event.instance_id) for s in event.shards])
        elif isinstance(event, TaskAssigned):
            ev.learn(event)
            env = ev.now().task_rank(event.task_id).stamp()
            await log.append(TaskCompleted(env=env, task_id=event.task_id, finish_reason="stop"))


async def request(log: EventLog, ev: LiveEvents, count: int, every_seconds: float, prefix: str = "t") -> list[TaskId]:
    tasks: list[TaskId] = []
    for n in range(count):
        created: TaskCreated = ev.now().created(f"{prefix}{n}")
        await log.append(created)
        tasks.append(created.task_id)
        await asyncio.sleep(every_seconds)
    return tasks


class Decisions(msgspec.Struct, kw_only=True):
    """How often the log stored each decision, per task or instance id."""

    assigned: collections.Counter[str]
    placed: collections.Counter[str]
    ended: collections.Counter[str]  # TaskCompleted + TaskFailed
    completed: set[str]

    @classmethod
    def of(cls, events: Sequence[AnyEvent]) -> Decisions:
        decisions = cls(
            assigned=collections.Counter(), placed=collections.Counter(), ended=collections.Counter(), completed=set()
        )
        for event in events:
            match event:
                case TaskAssigned():
                    decisions.assigned[event.task_id] += 1
                case InstancePlaced():
                    decisions.placed[event.instance_id] += 1
                case TaskCompleted() | TaskFailed():
                    decisions.ended[event.task_id] += 1
                    if isinstance(event, TaskCompleted):
                        decisions.completed.add(event.task_id)
                case _:
                    pass
        return decisions

    def check(self, tasks: Sequence[str]) -> None:
        """Nothing decided twice; every task assigned once and completed once."""
        assert max(self.placed.values()) == 1, self.placed
        assert all(self.assigned[t] == 1 for t in tasks), {t: self.assigned[t] for t in tasks if self.assigned[t] != 1}
        assert all(self.ended[t] == 1 for t in tasks), {t: self.ended[t] for t in tasks if self.ended[t] != 1}
        assert self.completed >= set(tasks)


async def read_log(log: EventLog) -> list[AnyEvent]:
    return [event async for _seq, event in log.replay(from_seq=1)]


async def wait_all_ended(log: EventLog, tasks: Sequence[str], timeout: float) -> Decisions:
    deadline = time.monotonic() + timeout
    while True:
        decisions = Decisions.of(await read_log(log))
        if all(decisions.ended[t] for t in tasks) or time.monotonic() > deadline:
            return decisions
        await asyncio.sleep(0.2)


def joined(ev: LiveEvents) -> list[LogEvent]:
    return [ev.now().node(n) for n in NODES]
