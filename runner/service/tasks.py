"""The runner's task loop: assignments from the log, in log order, on every rank alike.

Every instance serves through its continuous batch (`batch_serving.BatchServing`; `max_batch` = 1
is a batch of one, one task at a time): every rank is handed each task's `TaskCreated` by the
masters (`events.handover`) and builds the same request from it (deterministic), and the batch admits, runs and ends it at step
boundaries, its cancel vote and its checks agreed at the batch's steps (a bad request fails alike
on every rank). The sampling rank (the last) publishes the terminal event, after its last chunk,
so a reader of the task's subjects sees every chunk before `TaskCompleted`.
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
from runner.engine.protocols import CancelSource, PhaseTracker, RunnerSink
from runner.models.chat import encode_task_prompt
from runner.service.batch_serving import BatchLike, BatchServing
from runner.service.bridge import Assignment
from runner.service.heartbeats import RunningTasks

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
        BatchServing(self, self.batch).serve(stop, poll_seconds)

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
