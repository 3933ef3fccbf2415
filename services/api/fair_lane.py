"""A lane of worker threads shared fairly by API keys: when its threads are busy, the callers that
wait are served one key at a time in turn, each key's in arrival order.

The API checks grammars and sizes prompts on threads of a few lanes (`prompt_lanes.py`). A lane
that served its waiters in arrival order let one key's burst hold every other key's request behind
it: 48 slow schemas from one client, two checked at a time, kept another client's request waiting
for all of them. Now a freed thread goes to the waiting key that holds the fewest, then in turn,
so a newcomer from another key takes the first thread the burst frees, while the burst still has
every thread no one else asks for.

`runner.turns.Turns` is the pure order; `FairLane` the async shell that hands its threads out in that order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from typing import TypeVar, TypeVarTuple

import anyio

from runner.turns import Turns

R = TypeVar("R")
Args = TypeVarTuple("Args")


class FairLane:
    """`threads` worker threads; `run_sync` runs a call on one, waiting its key's turn when all are busy."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"a lane needs at least 1 thread, not {threads}")
        self.free = threads  # threads no caller holds
        self._turns: Turns[anyio.Event] = Turns()
        self._busy: Counter[Hashable] = Counter()  # threads held, by key
        self._limiter = anyio.CapacityLimiter(threads)  # never waited on: `free` hands the threads out

    @property
    def waiting(self) -> int:
        return len(self._turns)

    async def run_sync(self, key: Hashable, call: Callable[[*Args], R], *args: *Args) -> R:
        """`call(*args)` on a thread of the lane, once it is `key`'s turn. A caller cancelled while it
        waits leaves its place (or, served meanwhile, hands its thread on); one cancelled while its
        call runs holds the thread until the call returns, as anyio's threads do."""
        await self._take(key)
        try:
            return await anyio.to_thread.run_sync(call, *args, limiter=self._limiter)
        finally:
            self._give_back(key)

    async def _take(self, key: Hashable) -> None:
        if self.free > 0 and not self._turns:
            self.free -= 1
            self._busy[key] += 1
            self._turns.served(key, self._busy)
            return
        served = anyio.Event()
        self._turns.join(key, served)
        try:
            await served.wait()
        except BaseException:
            if not self._turns.leave(key, served):  # served as it was cancelled: the thread is its to pass on
                self._give_back(key)
            raise

    def _give_back(self, key: Hashable) -> None:
        self._busy[key] -= 1
        if self._busy[key] == 0:
            del self._busy[key]
        turn = self._turns.next(self._busy)
        if turn is None:
            self.free += 1
            return
        next_key, waiter = turn
        self._busy[next_key] += 1
        waiter.set()  # the thread goes straight to the next in turn
