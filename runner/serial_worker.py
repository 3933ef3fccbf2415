"""One daemon thread that runs the calls handed to it in the order they came, each answering
through a `Future`: what the step loop hands off so that it keeps stepping meanwhile (a newcomer's
grammar, `runner.preparer`; a large prompt's tokens, `runner.service.pending`).

A daemon: a runner that exits while a call runs (a grammar compiling, a long prompt tokenizing)
does not wait for it. The thread starts with the first call handed off. `settled` runs a call at
once, on the caller's thread, into the same kind of `Future`, for work too small for the hop.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from runner.affinity import leave_compute_cpu

T = TypeVar("T")


def settled(call: Callable[[], T]) -> Future[T]:
    """`call()` run now; its result, or the exception it raised (raised where the result is read)."""
    future: Future[T] = Future()
    fulfil(future, call)
    return future


class SerialWorker:
    def __init__(self, name: str) -> None:
        self._name = name
        self._work: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[[], T]) -> Future[T]:
        """`call()` on the worker thread, after every call submitted before it."""
        future: Future[T] = Future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._work.put((call, future))
        return future

    def _serve(self) -> None:
        leave_compute_cpu()  # its work is off the step loop: not on the CPU the loop is pinned to
        while True:
            call, future = self._work.get()
            fulfil(future, call)


def fulfil(future: Future[T], call: Callable[[], T]) -> None:
    """Run `call()` into `future`: its result, or the exception it raised. A future cancelled
    before its turn is skipped: no one reads it, and answering it would raise here, on the worker
    (which would stop serving every call after it)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(call())
    except Exception as exc:  # raised where the result is read, as if the call had run there
        future.set_exception(exc)
