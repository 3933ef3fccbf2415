"""The task loop under continuous batching: assignments join the running batch at step boundaries.

Every rank reads its instance's assignments from the log in the same order, builds each request
alike from what the masters hand over (`TaskServer.request_for`; a large prompt's off the step loop while the batch runs:
`pending.py`) and hands the ones built and not yet admitted to `ContinuousBatch.step`,
which admits the first of them once every rank holds them (the step's all-reduce carries each
rank's count, read after the rank's forward, so an assignment read meanwhile counts at once). While the batch is busy every rank steps; while it is empty a rank waits for an
assignment first, and every rank gets the same one, so all of them enter the step's collective.
The sampling rank publishes each task's terminal event when the task leaves the batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from events.catalogue import TaskFailed
from events.ids import TaskId
from runner.engine.batch_streams import CREATED_MISSING, Admission, StepResult
from runner.service.bridge import Assignment
from runner.service.pending import PendingAdmissions, is_large

if TYPE_CHECKING:
    from runner.service.tasks import TaskServer


class BatchLike(Protocol):
    @property
    def busy(self) -> bool: ...
    @property
    def members(self) -> tuple[str, ...]: ...
    def step(self, read_pending: Callable[[], Sequence[Admission]]) -> StepResult: ...


class BatchServing:
    def __init__(self, server: TaskServer, batch: BatchLike) -> None:
        self.server, self.batch = server, batch
        self.pending = PendingAdmissions(self._admission)  # read from the log, not admitted yet, in log order

    def serve(self, stop: threading.Event, poll_seconds: float) -> None:
        """Until `stop` is set with the batch empty (the flag is read between batches, as between tasks)."""
        while True:
            if not self.batch.busy:
                if stop.is_set():
                    return
                if not self.pending:
                    self._receive(self.server.inbox.next_assignment(poll_seconds), idle=True)
                    continue
                if not self.pending.built():  # read while the batch ran: its prompt is still being built
                    self.pending.wait_first(poll_seconds)
                    continue
            self._handle(self.batch.step(self._read_pending))

    def _read_pending(self) -> list[Admission]:
        """Every assignment read and built so far, in log order (the batch asks after its forward)."""
        while self._receive(self.server.inbox.next_assignment(0), idle=False):
            pass
        return self.pending.built()

    def _receive(self, assignment: Assignment | None, idle: bool) -> bool:
        if assignment is None:
            return False
        self.pending.add(assignment, at_once=idle or not is_large(assignment.created))  # None: to be handed over
        return True

    def _admission(self, assignment: Assignment) -> Admission:
        task_id = assignment.assigned.task_id
        request = self.server.request_for(assignment)
        server = self.server
        if isinstance(request, str):
            return Admission(task_id, None, server.cancel, server.sink, f"{CREATED_MISSING}: {request}")
        return Admission(task_id, request, server.cancel, server.sink, None)

    def _handle(self, result: StepResult) -> None:
        server = self.server
        was_idle = not server.running
        admitted = self.pending.pop(result.admitted)
        server.running = tuple(TaskId(t) for t in self.batch.members)
        if result.kv is not None:
            server.batch_kv(*result.kv)
        for admission in admitted:
            if admission.task_id in self.batch.members:
                server.status("running", admission.task_id)
        for ended in result.ended:
            task_id = TaskId(ended.task_id)
            if ended.outcome is None:
                failed = TaskFailed(
                    env=server.stamper.stamp(),
                    task_id=task_id,
                    error=ended.error or "",
                    invalid_request=ended.invalid_request,
                )
                server.terminal(failed)
            else:
                server.completed(task_id, ended.outcome)
        if not was_idle and not server.running:
            server.status("ready")
