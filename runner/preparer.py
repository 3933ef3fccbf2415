"""The runner's `Preparer`: a batch's newcomers with a grammar prepared on a worker thread, so the
step loop keeps decoding the others' tokens while it compiles (`runner.engine.preparation`).

`Engine.prepare` checks a request and, on the sampling rank, compiles its grammar; llguidance
releases the GIL while it builds and compiles one, so the step loop runs beside it. A request with
no grammar is prepared at once on the step loop: its checks cost microseconds, less than a thread
hop, and it joins the batch past any grammar still compiling (`step_plan.ready_to_admit`).

One worker compiles one grammar at a time, and the grammars waiting take turns by owner
(`GenerationRequest.cache_scope`, the API key; `runner.turns`), each owner's in log order: one
key's burst of slow grammars holds another key's grammar back by at most the one compiling, not by
the whole burst. The order is this rank's own: which newcomers join a step is agreed from every
rank's readiness (`agreed.prepared`), so ranks that finish in different orders still agree.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING

from runner.serial_worker import SerialWorker, fulfil, settled
from runner.turns import Turns

if TYPE_CHECKING:
    from runner.engine.preparation import Prepared
    from runner.engine.requests import GenerationRequest


class ThreadedPreparer:
    def __init__(self, prepare: Callable[[GenerationRequest], Prepared]) -> None:
        self._prepare = prepare
        self._futures: dict[str, Future[Prepared]] = {}  # the step loop's alone: the worker answers its own
        self._worker = SerialWorker("prepare-newcomers")
        self._lock = threading.Lock()  # the step loop and the worker share the two below
        self._turns: Turns[str] = Turns()  # the grammars not started yet, by owner: their task ids
        self._waiting: dict[str, tuple[GenerationRequest, Future[Prepared]]] = {}  # ... their requests

    def start(self, request: GenerationRequest) -> None:
        if request.task_id in self._futures:
            return
        if request.constraint is None:
            self._futures[request.task_id] = settled(partial(self._prepare, request))
            return
        future: Future[Prepared] = Future()
        self._futures[request.task_id] = future
        with self._lock:
            self._waiting[request.task_id] = (request, future)
            self._turns.join(request.cache_scope, request.task_id)
        self._worker.submit(self._prepare_next)  # one run per grammar: each takes the next in turn

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
        """A grammar not started yet is never compiled; one already taken finishes and is dropped."""
        self._futures.pop(task_id, None)
        with self._lock:
            waiting = self._waiting.pop(task_id, None)
            if waiting is not None:
                self._turns.leave(waiting[0].cache_scope, task_id)

    def _prepare_next(self) -> None:
        """On the worker: the grammar whose turn it is (none: the ones left were discarded)."""
        with self._lock:
            turn = self._turns.next()
            waiting = None if turn is None else self._waiting.pop(turn[1])
        if waiting is None:
            return
        request, future = waiting  # the future it was started with: a restart after a discard has its own
        fulfil(future, partial(self._prepare, request))
