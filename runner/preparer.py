"""The runner's `Preparer`: a batch's newcomers with a grammar prepared on a worker thread, so the
step loop keeps decoding the others' tokens while it compiles (`runner.engine.preparation`).

`Engine.prepare` checks a request and, on the sampling rank, compiles its grammar; llguidance
releases the GIL while it builds and compiles one, so the step loop runs beside it. A request with
no grammar is prepared at once on the step loop: its checks cost microseconds, less than a thread
hop. One worker, in log order: the batch admits in log order anyway.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.engine.engine import GenerationRequest
    from runner.engine.preparation import Prepared


class ThreadedPreparer:
    def __init__(self, prepare: Callable[[GenerationRequest], Prepared]) -> None:
        self._prepare = prepare
        self._futures: dict[str, Future[Prepared]] = {}
        self._work: queue.SimpleQueue[tuple[GenerationRequest, Future[Prepared]]] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def start(self, request: GenerationRequest) -> None:
        if request.task_id in self._futures:
            return
        future: Future[Prepared] = Future()
        self._futures[request.task_id] = future
        if request.constraint is None:
            _run(self._prepare, request, future)
            return
        if self._worker is None:  # a daemon: a runner that exits mid-compile does not wait for it
            self._worker = threading.Thread(target=self._serve, name="prepare-newcomers", daemon=True)
            self._worker.start()
        self._work.put((request, future))

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

    def _serve(self) -> None:
        while True:
            request, future = self._work.get()
            _run(self._prepare, request, future)


def _run(
    prepare: Callable[[GenerationRequest], Prepared], request: GenerationRequest, future: Future[Prepared]
) -> None:
    try:
        future.set_result(prepare(request))
    except Exception as exc:  # raised on the step loop by `take`, as if prepared there
        future.set_exception(exc)
