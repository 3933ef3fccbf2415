"""The runner's task loop: assignments from the log, in log order, on every rank alike, served by
the instance's continuous batch (`max_batch` 1 is a batch of one, one task at a time).

Every rank reads its instance's assignments in the same order and is handed each task's
`TaskCreated` by the masters (`events.handover`); it builds the same request from it
(deterministic: `request_for`; a large prompt's off the step loop while the batch runs:
`pending.py`) and hands the ones built and not yet admitted to `ContinuousBatch.step`, which admits
the first of them once every rank holds them (the step's all-reduce carries each rank's count, read
after the rank's forward, so an assignment read meanwhile counts at once). While the batch is busy
every rank steps; while it is empty a rank waits for an assignment first, and every rank gets the
same one, so all of them enter the step's collective. Cancel votes and checks are agreed at the
batch's steps (a bad request fails alike on every rank). The sampling rank (the last) publishes
each task's terminal event when the task leaves the batch, after its last chunk, so a reader of the
task's subjects sees every chunk before `TaskCompleted`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from loguru import logger

from events.catalogue import (
    ChoiceEnd,
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
from events.vocabulary import FinishReason, RunnerStatus
from runner.engine.batch_streams import CREATED_MISSING, Admission, StepResult
from runner.engine.protocols import CancelSource, PhaseTracker, RunnerSink
from runner.models.chat import encode_task_prompt
from runner.service.bridge import Assignment
from runner.service.heartbeats import RunningTasks
from runner.service.pending import PendingAdmissions, is_large

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    from runner.engine.requests import GenerationRequest


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
    @property
    def stop_sequence(self) -> str | None: ...
    @property
    def choices(self) -> Sequence[ChoiceLike]: ...


class ChoiceLike(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def finish_reason(self) -> FinishReason: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def stop_sequence(self) -> str | None: ...


class EngineLike(Protocol):
    @property
    def tokenizer(self) -> TokenizerWrapper: ...


class Inbox(Protocol):
    def publish(self, event: LogEvent | TelemetryEvent) -> None: ...
    def next_assignment(self, timeout: float) -> Assignment | None: ...
    def hand_over(self, assignment: Assignment) -> TaskCreated | str: ...


class BatchLike(Protocol):
    @property
    def busy(self) -> bool: ...
    @property
    def members(self) -> tuple[str, ...]: ...
    def step(self, read_pending: Callable[[], Sequence[Admission]]) -> StepResult: ...


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
        make_request: Callable[[str, list[int], TaskCreated], GenerationRequest],
        batch: BatchLike,
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
        self.batch = batch  # the instance's continuous batch (max_batch 1: a batch of one)
        self._running = running or RunningTasks()
        self.pending = PendingAdmissions(self._admission)  # read from the log, not admitted yet, in log order

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
        """Run assignments until `stop` is set with the batch empty (the flag is read between
        batches, as between tasks). Engine errors propagate (the group is broken), and so does
        `LogBridgeDown` (no assignment can come any more)."""
        while True:
            if not self.batch.busy:
                if stop.is_set():
                    return
                if not self.pending:
                    self._receive(self.inbox.next_assignment(poll_seconds), idle=True)
                    continue
                if not self.pending.built():  # read while the batch ran: its prompt is still being built
                    self.pending.wait_first(poll_seconds)
                    continue
            self._handle(self.batch.step(self._read_pending))

    def _read_pending(self) -> list[Admission]:
        """Every assignment read and built so far, in log order (the batch asks after its forward)."""
        while self._receive(self.inbox.next_assignment(0), idle=False):
            pass
        return self.pending.built()

    def _receive(self, assignment: Assignment | None, idle: bool) -> bool:
        if assignment is None:
            return False
        self.pending.add(assignment, at_once=idle or not is_large(assignment.created))  # None: to be handed over
        return True

    def _admission(self, assignment: Assignment) -> Admission:
        task_id = assignment.assigned.task_id
        request = self.request_for(assignment)
        if isinstance(request, str):
            return Admission(task_id, None, self.cancel, self.sink, f"{CREATED_MISSING}: {request}")
        return Admission(task_id, request, self.cancel, self.sink, None)

    def _handle(self, result: StepResult) -> None:
        """What a step's result says to the log: who runs, who ended and how, the batch's KV."""
        was_idle = not self.running
        admitted = self.pending.pop(result.admitted)
        self.running = tuple(TaskId(t) for t in self.batch.members)
        if result.kv is not None:
            self.batch_kv(*result.kv)
        for admission in admitted:
            if admission.task_id in self.batch.members:
                self.status("running", admission.task_id)
        for ended in result.ended:
            task_id = TaskId(ended.task_id)
            if ended.outcome is None:
                error = ended.error or ""
                failed = TaskFailed(
                    env=self.stamper.stamp(), task_id=task_id, error=error, invalid_request=ended.invalid_request
                )
                self.terminal(failed)
            else:
                self.completed(task_id, ended.outcome)
        if not was_idle and not self.running:
            self.status("ready")

    def request_for(self, assignment: Assignment) -> GenerationRequest | str:
        """The task's request, built alike on every rank from its `TaskCreated`, or why this rank
        could not have it (every rank then fails the task: the batch agrees on who holds one)."""
        task_id = assignment.assigned.task_id
        created = self.inbox.hand_over(assignment)
        if isinstance(created, str):
            logger.error("task {}: its request was not handed over: {}", task_id, created)
            return created
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
                stop_sequence=outcome.stop_sequence,
                usage=Usage(
                    prompt_tokens=outcome.prompt_tokens,
                    completion_tokens=outcome.completion_tokens,
                    ttft_ms=outcome.ttft_ms or 0.0,
                    prefill_tps=outcome.prefill_tps or 0.0,
                    decode_tps=outcome.decode_tps or 0.0,
                    cached_tokens=outcome.cached_tokens,
                ),
                choices=[
                    ChoiceEnd(
                        index=c.index,
                        finish_reason=c.finish_reason,
                        completion_tokens=c.completion_tokens,
                        stop_sequence=c.stop_sequence,
                    )
                    for c in outcome.choices
                ],
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
