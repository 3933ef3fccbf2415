"""The API's lanes take turns by key (`services/api/fair_lane.py`): one key's burst holds another
key's request back by at most one job per thread, nothing waits while a thread is free, and a
caller that gives up never costs the lane a thread."""

from __future__ import annotations

import threading
from collections import Counter

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.turns import Turns
from services.api.fair_lane import FairLane

pytestmark = pytest.mark.timeout(60)


def served(turns: Turns[str], count: int, busy: dict[str, int] | None = None) -> list[str | None]:
    taken = [turns.next(busy) for _ in range(count)]
    return [None if turn is None else turn[1] for turn in taken]


def test_turns_serve_the_least_recently_served_key_and_each_keys_waiters_in_arrival_order() -> None:
    turns: Turns[str] = Turns()
    for waiter in ("a1", "a2", "a3", "a4"):
        turns.join("a", waiter)
    assert served(turns, 1) == ["a1"]
    turns.join("b", "b1")  # arrives behind a burst: served before more of it
    turns.join("c", "c1")
    turns.join("b", "b2")
    assert served(turns, 7) == ["b1", "c1", "a2", "b2", "a3", "a4", None]


def test_the_key_that_holds_the_fewest_threads_is_served_first() -> None:
    turns: Turns[str] = Turns()
    for waiter in ("a1", "a2"):
        turns.join("a", waiter)
    turns.join("b", "b1")
    turns.join("c", "c1")
    assert turns.next({"a": 2, "b": 1}) == ("c", "c1")  # holds none
    assert turns.next({"a": 2, "b": 1, "c": 1}) == ("b", "b1")
    assert turns.next({"a": 1, "b": 1, "c": 1}) == ("a", "a1")  # the only one left waiting


def test_a_waiter_that_leaves_is_never_served() -> None:
    turns: Turns[str] = Turns()
    turns.join("a", "a1")
    turns.join("b", "b1")
    assert turns.leave("a", "a1") and len(turns) == 1
    assert not turns.leave("a", "a1")  # gone already
    assert served(turns, 1) == ["b1"]
    assert not turns.leave("b", "b1")  # served: not waiting any more
    assert turns.next() is None


@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=40), st.integers(1, 3))
def test_a_freed_thread_goes_to_a_waiting_key_that_holds_the_fewest(
    moves: list[tuple[str, bool]], threads: int
) -> None:
    """Joins (True) and job ends (False) in any order on a lane of `threads`: each freed thread goes
    to a waiting key holding no more threads than any other waiting key, each key's waiters in
    arrival order, and each waiter is served exactly once."""
    turns: Turns[tuple[str, int]] = Turns()
    joined: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    running: list[str] = []
    order: list[tuple[str, int]] = []

    def serve() -> None:
        waiting = {w[0] for w in waiters(turns)}
        turn = turns.next(busy)
        assert turn is not None
        key, waiter = turn
        assert busy[key] == min(busy[k] for k in waiting), (key, busy, waiting)
        busy[key] += 1
        running.append(key)
        order.append(waiter)

    for key, join in moves:
        if join:
            turns.join(key, (key, joined[key]))
            joined[key] += 1
            if len(running) < threads:
                serve()
        elif running:
            busy[running.pop(0)] -= 1
            if len(turns):
                serve()
    while len(turns):
        busy[running.pop(0)] -= 1
        serve()
    assert sorted(order) == sorted((key, i) for key, n in joined.items() for i in range(n))
    for key in joined:
        assert [i for k, i in order if k == key] == list(range(joined[key]))


def waiters(turns: Turns[tuple[str, int]]) -> list[tuple[str, int]]:
    """The waiters still waiting (drained from a copy)."""
    copy: Turns[tuple[str, int]] = Turns()
    copy._queues = {k: q.copy() for k, q in turns._queues.items()}  # pyright: ignore[reportPrivateUsage]
    left = []
    while (turn := copy.next()) is not None:
        left.append(turn[1])
    return left


async def test_another_keys_request_takes_the_thread_a_burst_frees_first() -> None:
    """One thread; key "burst" queues 20 jobs, each held until released; key "other" then asks for
    one: it takes the thread the burst's running job frees, before the burst's 19 others."""
    lane = FairLane(1)
    order: list[str] = []
    gates = [threading.Event() for _ in range(21)]

    def job(name: str, gate: threading.Event) -> str:
        assert gate.wait(10)
        order.append(name)
        return name

    async with anyio.create_task_group() as group:
        for i in range(20):
            group.start_soon(lane.run_sync, "burst", job, f"burst-{i}", gates[i])
        await anyio.sleep(0.05)
        group.start_soon(lane.run_sync, "other", job, "other", gates[20])
        await anyio.sleep(0.05)
        assert lane.free == 0 and lane.waiting == 20  # 1 running, 19 of the burst and "other" waiting
        for gate in gates:
            gate.set()
    assert order[:2] == ["burst-0", "other"]
    assert lane.free == 1 and lane.waiting == 0


async def test_every_thread_is_used_while_one_key_asks_alone() -> None:
    lane = FairLane(3)
    running, most = 0, 0
    lock = threading.Lock()
    release = threading.Event()

    def job() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(10)
        with lock:
            running -= 1

    async with anyio.create_task_group() as group:
        for _ in range(6):
            group.start_soon(lane.run_sync, "k", job)
        await anyio.sleep(0.1)
        assert most == 3 and lane.waiting == 3
        release.set()
    assert lane.free == 3


async def test_a_caller_that_gives_up_waiting_or_running_never_costs_the_lane_a_thread() -> None:
    """Cancelled while waiting: it leaves its place; cancelled while its job runs: the thread comes
    back when the job ends; the lane then still runs as many at once as it has threads."""
    lane = FairLane(2)
    release = threading.Event()

    def job() -> None:
        release.wait(10)

    async with anyio.create_task_group() as group:
        for _ in range(5):
            group.start_soon(lane.run_sync, "k", job)
        await anyio.sleep(0.05)
        assert lane.free == 0 and lane.waiting == 3
        group.cancel_scope.cancel()  # the client went away: every one of them
        release.set()
    assert lane.free == 2 and lane.waiting == 0
    release.clear()
    async with anyio.create_task_group() as group:
        for _ in range(2):
            group.start_soon(lane.run_sync, "k", job)
        await anyio.sleep(0.05)
        assert lane.free == 0 and lane.waiting == 0  # both running at once
        release.set()
    assert lane.free == 2


async def test_an_error_in_a_job_is_the_callers_and_the_thread_comes_back() -> None:
    lane = FairLane(1)

    def broken() -> None:
        raise ValueError("the tokenizer failed")

    with pytest.raises(ValueError, match="the tokenizer failed"):
        await lane.run_sync("k", broken)
    assert await lane.run_sync("k", lambda: 7) == 7
    assert lane.free == 1


def test_a_lane_without_threads_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 thread"):
        FairLane(0)
