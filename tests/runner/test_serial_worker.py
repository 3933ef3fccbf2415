"""The runner's one-thread worker (`runner/serial_worker.py`): calls run in the order handed off, on
one thread not the caller's; a call's exception is raised where its result is read; a call
cancelled before its turn is skipped and the worker goes on serving the ones after it."""

from __future__ import annotations

import threading

import pytest

from runner.serial_worker import SerialWorker, settled

pytestmark = pytest.mark.timeout(30)


def test_calls_run_in_order_on_one_thread_and_errors_reach_the_reader() -> None:
    worker = SerialWorker("test-worker")
    ran: list[tuple[int, str]] = []

    def call(n: int) -> int:
        ran.append((n, threading.current_thread().name))
        if n == 2:
            raise ValueError("two")
        return n * 10

    futures = [worker.submit(lambda n=n: call(n)) for n in range(5)]
    assert [f.exception(5) is None for f in futures] == [True, True, False, True, True]
    assert [f.result() for i, f in enumerate(futures) if i != 2] == [0, 10, 30, 40]
    with pytest.raises(ValueError, match="two"):
        futures[2].result()
    assert [n for n, _ in ran] == [0, 1, 2, 3, 4]
    assert {name for _, name in ran} == {"test-worker"}


def test_a_call_cancelled_before_its_turn_is_skipped_and_the_worker_goes_on() -> None:
    worker = SerialWorker("test-worker")
    release = threading.Event()
    ran: list[str] = []
    first = worker.submit(lambda: release.wait(5) and ran.append("first"))
    skipped = worker.submit(lambda: ran.append("skipped"))
    assert skipped.cancel()  # still queued behind the first
    after = worker.submit(lambda: ran.append("after"))
    release.set()
    after.result(5)
    first.result(5)
    assert ran == ["first", "after"] and skipped.cancelled()


def test_settled_runs_the_call_at_once_on_the_callers_thread() -> None:
    future = settled(threading.current_thread)
    assert future.done() and future.result() is threading.current_thread()
    with pytest.raises(ZeroDivisionError):
        settled(lambda: 1 // 0).result()
