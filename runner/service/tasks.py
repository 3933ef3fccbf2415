"""The runner's task loop: assignments from the log, in log order, on every rank alike.

Per assignment every rank:
1. fetches the task's `TaskCreated` and builds the same request from it (deterministic);
2. agrees with its peers to start or skip (one all-reduce: a task cancelled or failed before it
   started is skipped by all, never by some);
3. checks the request (same verdict everywhere: a bad request fails without any collective);
4. runs the engine, whose sink publishes progress and chunks.
The sampling rank (the last) publishes the terminal event, after its last chunk, so a reader
of the task's subjects sees every chunk before `TaskCompleted`. With a `batch` (max_batch > 1) the
loop is `batch_serving.BatchServing`: the same requests and terminal events, but tasks join and
leave a running batch at step boundaries instead of running one after another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from loguru import logger

from events.catalogue import (
    LogEvent,
    RunnerStatusChanged,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TelemetryEvent,
    Usage,
)
from events.ids import InstanceId, TaskId
from events.stamp import Stamper
from events.subjects import task_subject
from events.vocabulary import FinishReason, RunnerStatus
from runner.engine.batch_streams import CREATED_MISSING
from runner.engine.protocols import CancelSource, PhaseTracker, RunnerSink
from runner.errors import RequestError
from runner.models.chat import encode_task_prompt
from runner.service.batch_serving import BatchLike, BatchServing
from runner.service.bridge import Assignment
from runner.service.heartbeats import RunningTasks


class Outcome(Protocol):
    @property
    def finish_reason(self) -> FinishReason: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def ttft_ms(self) -> float | None: ...
    @property
    def prefill_tps(self) -> float | None: ...
    @property
    def decode_tps(self) -> float | None: ...
    @property
    def cached_tokens(self) -> int: ...


class EngineLike(Protocol):
    @property
    def tokenizer(self) -> Any: ...
    def agree_start(self, task_id: str, cancel: CancelSource, phases: PhaseTracker | None = None) -> bool: ...
    def validate(self, request: Any) -> None: ...
    def generate(self, request: Any, cancel: CancelSource, sink: RunnerSink, phases: PhaseTracker) -> Outcome: ...


class Inbox(Protocol):
    def publish(self, event: LogEvent | TelemetryEvent) -> None: ...
    def next_assignment(self, timeout: float) -> Assignment | None: ...
    def fetch(self, subject: str, timeout: float = 10.0) -> Any: ...


class TaskServer:
    def __init__(
        self,
        *,
        engine: EngineLike,
        inbox: Inbox,
        cancel: CancelSource,
        sink: RunnerSink,
        stamper: Stamper,
        phases: PhaseTracker,
        instance_id: InstanceId,
        rank: int,
        is_sampling_rank: bool,
        make_request: Callable[[str, list[int], TaskCreated], Any],
        batch: BatchLike | None = None,
        running: RunningTasks | None = None,
    ) -> None:
        """`running`: where the tasks being run are kept, for error reports and the heartbeats."""
        self.engine = engine
        self.inbox = inbox
        self.cancel = cancel
        self.sink = sink
        self.stamper = stamper
        self.phases = phases
        self.instance_id = instance_id
        self.rank = rank
        self.is_sampling_rank = is_sampling_rank
        self.make_request = make_request
        self.batch = batch  # continuous batching (max_batch > 1); None: one task at a time
        self._running = running or RunningTasks()

    @property
    def running(self) -> tuple[TaskId, ...]:
        """The tasks the ranks are running (the batch), for error reports and the heartbeats."""
        return self._running.tasks

    @running.setter
    def running(self, tasks: tuple[TaskId, ...]) -> None:
        self._running.tasks = tasks

    def batch_kv(self, reserved: int, capacity: int) -> None:
        """The batch's KV positions, reserved and held (the heartbeats carry them)."""
        self._running.kv = (reserved, capacity)

    def serve(self, stop: threading.Event, poll_seconds: float = 0.2) -> None:
        """Run assignments until `stop` is set. Engine errors propagate (the group is broken), and so
        does `LogBridgeDown` (no assignment can come any more)."""
        if self.batch is not None:
            BatchServing(self, self.batch).serve(stop, poll_seconds)
            return
        while not stop.is_set():
            assignment = self.inbox.next_assignment(poll_seconds)
            if assignment is not None:
                self.running = (assignment.assigned.task_id,)
                self.run_one(assignment.assigned.task_id, assignment.created)
                self.running = ()

    def run_one(self, task_id: TaskId, created: TaskCreated | None = None) -> None:
        request = self.request_for(task_id, created)
        if request is None:
            # Every rank reads the same log, so every rank takes this branch together.
            self.terminal(TaskFailed(env=self.stamper.stamp(), task_id=task_id, error=CREATED_MISSING))
            return
        if not self.engine.agree_start(task_id, self.cancel, self.phases):
            self.terminal(TaskCompleted(env=self.stamper.stamp(), task_id=task_id, finish_reason="cancelled"))
            return
        try:
            self.engine.validate(request)
        except RequestError as exc:
            refused = TaskFailed(env=self.stamper.stamp(), task_id=task_id, error=str(exc), invalid_request=True)
            self.terminal(refused)
            return
        self.status("running", task_id)
        outcome = self.engine.generate(request, self.cancel, self.sink, self.phases)
        self.completed(task_id, outcome)
        self.status("ready", task_id)

    def request_for(self, task_id: TaskId, created: TaskCreated | None) -> Any | None:
        """The task's request, built alike on every rank from its `TaskCreated` (None: not in the log)."""
        if created is None:
            created = self.inbox.fetch(task_subject(task_id, "created"))
        if not isinstance(created, TaskCreated):
            return None
        params = created.params
        prompt = encode_task_prompt(
            self.engine.tokenizer, created.messages, params.tools, created.prompt, params.enable_thinking
        )
        return self.make_request(task_id, prompt, created)

    def completed(self, task_id: TaskId, outcome: Outcome) -> None:
        self.terminal(
            TaskCompleted(
                env=self.stamper.stamp(),
                task_id=task_id,
                finish_reason=outcome.finish_reason,
                usage=Usage(
                    prompt_tokens=outcome.prompt_tokens,
                    completion_tokens=outcome.completion_tokens,
                    ttft_ms=outcome.ttft_ms or 0.0,
                    prefill_tps=outcome.prefill_tps or 0.0,
                    decode_tps=outcome.decode_tps or 0.0,
                    cached_tokens=outcome.cached_tokens,
                ),
            )
        )

    def status(self, status: RunnerStatus, detail: str = "") -> None:
        self.inbox.publish(
            RunnerStatusChanged(
                env=self.stamper.stamp(), instance_id=self.instance_id, rank=self.rank, status=status, detail=detail
            )
        )

    def terminal(self, event: TaskCompleted | TaskFailed) -> None:
        if self.is_sampling_rank:
            logger.info("task {} ended: {}", event.task_id, type(event).__name__)
            self.inbox.publish(event)
