"""The task loop under continuous batching, on the real engine (tiny model, one rank) with a scripted
inbox: several tasks share the batch, a bad request and a task missing from the log fail alone, and
the others complete with the tokens they get alone."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from events.catalogue import LogEvent, RunnerStatusChanged, TaskAssigned, TaskCompleted, TaskFailed, TelemetryEvent
from events.ids import InstanceId, TaskId
from events.runner_settings import RunnerSettings
from runner.engine.batch import ContinuousBatch
from runner.engine.engine import Engine
from runner.engine.protocols import NeverCancelled, NullSink, PhaseTracker
from runner.engine.requests import GenerationRequest
from runner.engine.shard import ShardPlacement
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny
from runner.service.bridge import Assignment
from runner.service.tasks import TaskServer
from runner.shard_loading import load_shard
from tests.events.builders import Events, fake_stamper
from tests.runner.harness import served_alone

pytestmark = pytest.mark.timeout(120)
LENGTHS = {"t1": 9, "bad": 4, "t2": 17, "t3": 1}


@dataclass
class ScriptedInbox:
    """Hands out its assignments, then sets `stop` (the loop ends once the batch is empty)."""

    stop: threading.Event
    assignments: list[Assignment] = field(default_factory=list)
    published: list[LogEvent | TelemetryEvent] = field(default_factory=list)

    def publish(self, event: LogEvent | TelemetryEvent) -> None:
        self.published.append(event)

    def next_assignment(self, timeout: float) -> Assignment | None:
        if not self.assignments:
            self.stop.set()
            return None
        return self.assignments.pop(0)

    def hand_over(self, assignment: Assignment) -> Any:
        return assignment.created or "the masters know no such task"  # the ghost task's


def make_request(task_id: str, prompt: list[int], created: Any) -> GenerationRequest:
    max_tokens = 0 if task_id == "bad" else 6  # max_tokens 0: refused by validation, on every rank alike
    return GenerationRequest(
        task_id=task_id, prompt_token_ids=synthetic_prompt(LENGTHS[task_id]), max_tokens=max_tokens
    )


def test_tasks_share_the_batch_and_bad_ones_fail_alone() -> None:
    shard = load_shard(cached_tiny(), ShardPlacement(0, 1, ((0, 8),)), None)
    engine = Engine(None, shard, RunnerSettings(prefill_step_size=6))
    ev, stop = Events(), threading.Event()
    inbox = ScriptedInbox(stop)
    for task_id in ("t1", "bad", "ghost", "t2", "t3"):
        assigned = TaskAssigned(env=ev.master.stamp(), task_id=TaskId(task_id), instance_id=InstanceId("i1"))
        inbox.assignments.append(Assignment(assigned, 0, None if task_id == "ghost" else ev.created(task_id)))
    phases = PhaseTracker()
    server = TaskServer(
        engine=engine,
        inbox=inbox,
        cancel=NeverCancelled(),
        sink=NullSink(),
        stamper=fake_stamper("runner"),
        phases=phases,
        instance_id=InstanceId("i1"),
        rank=0,
        is_sampling_rank=True,
        make_request=make_request,
        batch=ContinuousBatch(engine, phases, max_batch=3),
    )
    server.serve(stop, poll_seconds=0.01)
    failed = {str(e.task_id): e.error for e in inbox.published if isinstance(e, TaskFailed)}
    assert set(failed) == {"bad", "ghost"}
    assert "max_tokens must be > 0" in failed["bad"] and "the masters know no such task" in failed["ghost"]
    completed = {str(e.task_id): e for e in inbox.published if isinstance(e, TaskCompleted)}
    assert set(completed) == {"t1", "t2", "t3"}
    for task_id, event in completed.items():
        alone = served_alone(engine, make_request(task_id, [], None))
        assert event.usage.completion_tokens == alone.completion_tokens
        assert event.finish_reason == alone.finish_reason
    statuses = [(e.status, e.detail) for e in inbox.published if isinstance(e, RunnerStatusChanged)]
    assert statuses[:-1] == [("running", "t1"), ("running", "t2"), ("running", "t3")]
    assert statuses[-1] == ("ready", "") and server.running == ()


def test_a_row_that_joins_the_batch_keeps_its_kv_only_in_the_batchs_cache() -> None:
    """A stream prefills into caches of its own; once it joins the rows, the batch's cache holds its
    KV (a copy, for a second row) and the stream lets go of its own, so no decoding row keeps its
    prompt's KV twice for its whole life."""
    from runner.engine.batch_streams import Admission, still_pending

    shard = load_shard(cached_tiny(), ShardPlacement(0, 1, ((0, 8),)), None)
    engine = Engine(None, shard, RunnerSettings(prefill_step_size=32))
    batch = ContinuousBatch(engine, PhaseTracker(), max_batch=4)
    pending = [
        Admission(
            t,
            GenerationRequest(task_id=t, prompt_token_ids=synthetic_prompt(n), max_tokens=50),
            NeverCancelled(),
            NullSink(),
        )
        for t, n in (("first", 40), ("second", 70))
    ]
    reported = []
    for _ in range(20):
        result = batch.step(lambda: list(pending))
        pending[:] = still_pending(pending, result.admitted)
        reported += [result.kv] if result.kv is not None else []
        if len(batch.micro.rows) == 2:
            break
    assert reported == [(2 * (70 + 50), engine.kv_capacity)]  # both admitted at once: padded to the longer
    assert set(batch.micro.rows) == {"first", "second"}
    for task_id in batch.micro.rows:
        assert batch.streams[task_id].run.caches.states() == []  # its KV lives in the batch's cache only
    part = next(p for p in batch.micro.parts if p.rows)
    assert part.cache is not None and part.cache.rows == 2
