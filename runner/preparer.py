"""The runner's `Preparer`: a batch's newcomers with a grammar prepared on a worker thread, so the
step loop keeps decoding the others' tokens while it compiles (`runner.engine.preparation`).

`Engine.prepare` checks a request and, on the sampling rank, compiles its grammar; llguidance
releases the GIL while it builds and compiles one, so the step loop runs beside it. A request with
no grammar is prepared at once on the step loop: its checks cost microseconds, less than a thread
hop, and it joins the batch past any grammar still compiling (`batch_plan.ready_to_admit`). One
worker, in log order: grammars are compiled one at a time, oldest first, beside the step loop.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING

from runner.serial_worker import SerialWorker, settled

if TYPE_CHECKING:
    from runner.engine.engine import GenerationRequest
    from runner.engine.preparation import Prepared


class ThreadedPreparer:
    def __init__(self, prepare: Callable[[GenerationRequest], Prepared]) -> None:
        self._prepare = prepare
        self._futures: dict[str, Future[Prepared]] = {}
        self._worker = SerialWorker("prepare-newcomers")

    def start(self, request: GenerationRequest) -> None:
        if request.task_id in self._futures:
            return
        call = partial(self._prepare, request)
        self._futures[request.task_id] = settled(call) if request.constraint is None else self._worker.submit(call)

    def ready(self, task_id: str) -> bool:
        future = self._futures.get(task_id)
        return future is not None and future.done()

    def wait(self, task_id: str, timeout_seconds: float) -> None:
        future = self._futures.get(task_id)
        if future is not None:
            futures.wait([future], timeout_seconds)

    def take(self, task_id: str) -> Prepared:
        return self._futures.pop(task_id).result()  # done: every rank agreed it is ready

    def discard(self, task_id: str) -> None:
        self._futures.pop(task_id, None)  # one still queued is prepared and dropped
