"""The runner's task loop with a fake engine and inbox: what each rank publishes, and when."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from events.catalogue import LogEvent, RunnerStatusChanged, TaskAssigned, TaskCompleted, TaskFailed, TelemetryEvent
from events.ids import InstanceId, TaskId
from events.vocabulary import FinishReason
from runner.engine.protocols import CancelSource, NullSink, PhaseTracker, RunnerSink
from runner.errors import RequestError
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


@dataclass
class FakeEngine:
    start: bool = True
    invalid: bool = False
    generated: list[Any] = field(default_factory=list)

    @property
    def tokenizer(self) -> Any:
        return FakeTokenizer()

    def agree_start(self, task_id: str, cancel: CancelSource, phases: PhaseTracker | None = None) -> bool:
        return self.start

    def validate(self, request: Any) -> None:
        if self.invalid:
            raise RequestError("prompt has 9000 tokens but the model's context is 4096")

    def generate(self, request: Any, cancel: CancelSource, sink: RunnerSink, phases: PhaseTracker) -> FakeOutcome:
        self.generated.append(request)
        return FakeOutcome()


@dataclass
class FakeInbox:
    assignments: list[Assignment] = field(default_factory=list)
    published: list[LogEvent | TelemetryEvent] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)
    created: dict[str, Any] = field(default_factory=dict)

    def publish(self, event: LogEvent | TelemetryEvent) -> None:
        self.published.append(event)

    def next_assignment(self, timeout: float) -> Assignment | None:
        return self.assignments.pop(0) if self.assignments else None

    def fetch(self, subject: str, timeout: float = 10.0) -> Any:
        self.fetched.append(subject)
        return self.created.get(subject.split(".")[3])

    def is_cancelled(self, task_id: str) -> bool:
        return False


def _server(engine: FakeEngine, inbox: FakeInbox, *, sampling: bool) -> TaskServer:
    return TaskServer(
        engine=engine,
        inbox=inbox,
        cancel=inbox,
        sink=NullSink(),
        stamper=fake_stamper("runner"),
        phases=PhaseTracker(),
        instance_id=InstanceId("i1"),
        rank=1 if sampling else 0,
        is_sampling_rank=sampling,
        make_request=lambda task_id, prompt, created: (task_id, prompt, created.params.max_tokens),
    )


def _assignment(ev: Events, task_id: str, with_created: bool = True) -> Assignment:
    assigned = TaskAssigned(env=ev.master.stamp(), task_id=TaskId(task_id), instance_id=InstanceId("i1"))
    return Assignment(assigned, ev.created(task_id) if with_created else None)


def _serve_all(server: TaskServer, inbox: FakeInbox) -> None:
    while inbox.assignments:
        assignment = inbox.next_assignment(0)
        assert assignment is not None
        server.run_one(assignment.assigned.task_id, assignment.created)


@pytest.mark.parametrize("sampling", [True, False])
def test_a_task_runs_and_only_the_sampling_rank_ends_it(sampling: bool) -> None:
    ev, inbox, engine = Events(), FakeInbox(), FakeEngine()
    inbox.assignments.append(_assignment(ev, "t1"))
    _serve_all(_server(engine, inbox, sampling=sampling), inbox)
    assert len(engine.generated) == 1 and engine.generated[0][0] == "t1"
    statuses = [e.status for e in inbox.published if isinstance(e, RunnerStatusChanged)]
    assert statuses == ["running", "ready"]
    ends = [e for e in inbox.published if isinstance(e, TaskCompleted)]
    assert len(ends) == (1 if sampling else 0)
    if sampling:
        assert ends[0].finish_reason == "length" and ends[0].usage.completion_tokens == 3


def test_a_task_skipped_by_agreement_ends_cancelled_without_generating() -> None:
    ev, inbox, engine = Events(), FakeInbox(), FakeEngine(start=False)
    inbox.assignments.append(_assignment(ev, "t1"))
    _serve_all(_server(engine, inbox, sampling=True), inbox)
    assert engine.generated == []
    assert [type(e).__name__ for e in inbox.published] == ["TaskCompleted"]
    assert isinstance(inbox.published[0], TaskCompleted) and inbox.published[0].finish_reason == "cancelled"


def test_a_bad_request_fails_the_task_with_the_runners_message() -> None:
    ev, inbox, engine = Events(), FakeInbox(), FakeEngine(invalid=True)
    inbox.assignments.append(_assignment(ev, "t1"))
    _serve_all(_server(engine, inbox, sampling=True), inbox)
    failed = [e for e in inbox.published if isinstance(e, TaskFailed)]
    assert engine.generated == [] and "context is 4096" in failed[0].error


def test_created_before_the_runner_watched_is_fetched_from_the_log() -> None:
    ev, inbox, engine = Events(), FakeInbox(), FakeEngine()
    inbox.created["t1"] = ev.created("t1")
    inbox.assignments.append(_assignment(ev, "t1", with_created=False))
    _serve_all(_server(engine, inbox, sampling=True), inbox)
    assert inbox.fetched == ["shoal.ev.task.t1.created"] and len(engine.generated) == 1


def test_a_task_missing_from_the_log_fails_on_every_rank_alike() -> None:
    ev, inbox, engine = Events(), FakeInbox(), FakeEngine()
    inbox.assignments.append(_assignment(ev, "ghost", with_created=False))
    _serve_all(_server(engine, inbox, sampling=True), inbox)
    assert engine.generated == []
    assert isinstance(inbox.published[0], TaskFailed) and "not found" in inbox.published[0].error
