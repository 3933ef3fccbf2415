"""The runner's task loop (`TaskServer`: one loop over the instance's batch) with a fake batch and inbox:
what each rank publishes, and when. The batch's own decisions (admission, cancel votes, checks)
are the real `ContinuousBatch`'s, tested on real groups (tests/runner/test_group_batch.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from events.catalogue import LogEvent, RunnerStatusChanged, TaskAssigned, TaskCompleted, TaskFailed, TelemetryEvent
from events.ids import InstanceId, TaskId
from events.vocabulary import FinishReason
from runner.engine.batch_streams import CREATED_MISSING, Admission, Ended, StepResult
from runner.engine.protocols import NullSink, PhaseTracker
from runner.service.bridge import Assignment
from runner.service.tasks import TaskServer
from tests.events.builders import Events, fake_stamper


class FakeTokenizer:
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 97 for c in text]


@dataclass
class FakeOutcome:
    finish_reason: FinishReason = "length"
    prompt_tokens: int = 5
    completion_tokens: int = 3
    ttft_ms: float | None = 12.0
    prefill_tps: float | None = 100.0
    decode_tps: float | None = 50.0
    cached_tokens: int = 0
    stop_sequence: str | None = None
    choices: tuple[Any, ...] = ()


@dataclass
class FakeEngine:
    @property
    def tokenizer(self) -> Any:
        return FakeTokenizer()


@dataclass
class OneAtATime:
    """A batch of one: admits the first pending admission at a step and ends it at the next, with
    the outcome the test gives it (an error for an admission whose request could not be built, as
    `ContinuousBatch` does)."""

    ends: dict[str, Ended | None] = field(default_factory=dict)  # task -> how it ends (None: completes)
    members: tuple[str, ...] = ()
    admitted: list[Any] = field(default_factory=list)  # the requests the batch ran

    @property
    def busy(self) -> bool:
        return bool(self.members)

    def step(self, read_pending: Callable[[], Sequence[Admission]]) -> StepResult:
        pending = read_pending()
        ended = [self._end(task_id) for task_id in self.members]
        self.members = ()
        if not pending:
            return StepResult((), ended)
        first = pending[0]
        if first.request is None:
            return StepResult((first.task_id,), [*ended, Ended(first.task_id, None, first.error)])
        self.admitted.append(first.request)
        self.members = (first.task_id,)
        return StepResult((first.task_id,), ended)

    def _end(self, task_id: str) -> Ended:
        how = self.ends.get(task_id)
        return how if how is not None else Ended(task_id, FakeOutcome())  # pyright: ignore[reportArgumentType]


@dataclass
class FakeInbox:
    assignments: list[Assignment] = field(default_factory=list)
    published: list[LogEvent | TelemetryEvent] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)
    created: dict[str, Any] = field(default_factory=dict)

    def publish(self, event: LogEvent | TelemetryEvent) -> None:
        self.published.append(event)

    stop: threading.Event = field(default_factory=threading.Event)

    def next_assignment(self, timeout: float) -> Assignment | None:
        if not self.assignments:
            self.stop.set()  # all served: the loop stops once the batch is idle
            return None
        return self.assignments.pop(0)

    def hand_over(self, assignment: Assignment) -> Any:
        """As the masters would: the task's TaskCreated, or why not (a task they do not know)."""
        if assignment.created is not None:
            return assignment.created
        task_id = assignment.assigned.task_id
        self.fetched.append(task_id)
        return self.created.get(task_id, f"task {task_id} is not in the master's State")

    def is_cancelled(self, task_id: str) -> bool:
        return False


def _server(batch: OneAtATime, inbox: FakeInbox, *, sampling: bool) -> TaskServer:
    return TaskServer(
        engine=FakeEngine(),
        inbox=inbox,
        cancel=inbox,
        sink=NullSink(),
        stamper=fake_stamper("runner"),
        phases=PhaseTracker(),
        instance_id=InstanceId("i1"),
        rank=1 if sampling else 0,
        is_sampling_rank=sampling,
        make_request=lambda task_id, prompt, created: (task_id, prompt, created.params.max_tokens),
        batch=batch,
    )


def _assignment(ev: Events, task_id: str, with_created: bool = True) -> Assignment:
    assigned = TaskAssigned(env=ev.master.stamp(), task_id=TaskId(task_id), instance_id=InstanceId("i1"))
    return Assignment(assigned, 7, ev.created(task_id) if with_created else None)


def _serve_all(server: TaskServer, inbox: FakeInbox) -> None:
    server.serve(inbox.stop, poll_seconds=0)


@pytest.mark.parametrize("sampling", [True, False])
def test_a_task_runs_and_only_the_sampling_rank_ends_it(sampling: bool) -> None:
    ev, inbox, batch = Events(), FakeInbox(), OneAtATime()
    inbox.assignments.append(_assignment(ev, "t1"))
    _serve_all(_server(batch, inbox, sampling=sampling), inbox)
    assert len(batch.admitted) == 1 and batch.admitted[0][0] == "t1"
    statuses = [e.status for e in inbox.published if isinstance(e, RunnerStatusChanged)]
    assert statuses == ["running", "ready"]
    ends = [e for e in inbox.published if isinstance(e, TaskCompleted)]
    assert len(ends) == (1 if sampling else 0)
    if sampling:
        assert ends[0].finish_reason == "length" and ends[0].usage.completion_tokens == 3


def test_tasks_run_one_after_another_in_log_order() -> None:
    ev, inbox, batch = Events(), FakeInbox(), OneAtATime()
    inbox.assignments += [_assignment(ev, "t1"), _assignment(ev, "t2")]
    _serve_all(_server(batch, inbox, sampling=True), inbox)
    assert [request[0] for request in batch.admitted] == ["t1", "t2"]
    assert [e.task_id for e in inbox.published if isinstance(e, TaskCompleted)] == ["t1", "t2"]


def test_a_bad_request_fails_the_task_with_the_runners_message() -> None:
    ev, inbox = Events(), FakeInbox()
    refused = Ended("t1", None, "prompt has 9000 tokens but the model's context is 4096", invalid_request=True)
    batch = OneAtATime(ends={"t1": refused})
    inbox.assignments.append(_assignment(ev, "t1"))
    _serve_all(_server(batch, inbox, sampling=True), inbox)
    failed = [e for e in inbox.published if isinstance(e, TaskFailed)]
    assert "context is 4096" in failed[0].error and failed[0].invalid_request


def test_a_request_not_carried_is_handed_over_by_the_masters() -> None:
    ev, inbox, batch = Events(), FakeInbox(), OneAtATime()
    inbox.created["t1"] = ev.created("t1")
    inbox.assignments.append(_assignment(ev, "t1", with_created=False))
    _serve_all(_server(batch, inbox, sampling=True), inbox)
    assert inbox.fetched == ["t1"] and len(batch.admitted) == 1


def test_a_task_the_masters_refuse_fails_with_their_reason() -> None:
    ev, inbox, batch = Events(), FakeInbox(), OneAtATime()
    inbox.assignments.append(_assignment(ev, "ghost", with_created=False))
    _serve_all(_server(batch, inbox, sampling=True), inbox)
    assert batch.admitted == []
    failed = [e for e in inbox.published if isinstance(e, TaskFailed)]
    assert len(failed) == 1 and failed[0].error == f"{CREATED_MISSING}: task ghost is not in the master's State"
