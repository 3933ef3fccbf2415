"""Fault injection for tests, the same in both shells. Off unless SHOAL_TEST_FAULT names this rank.

SHOAL_TEST_FAULT="<action>:<rank>:<poll>[:<seconds>]" makes rank <rank> act once, inside its
<poll>-th cancel poll of the first real task it runs, or, with `load` for <poll>, while it loads
(before it joins the ring group: a rank that freezes there leaves its instance never ready):
- `sleep:<rank>:<poll>:<seconds>`: sleep there, as a wedged collective or a slow rank would;
- `freeze:<rank>:<poll>`: SIGSTOP the process, so every thread stops and its heartbeats go silent;
- `die:<rank>:<poll>`: SIGKILL it.
Both shells count polls the same way, as both serve every task through the batch loop: a task's
polls are its cancel votes, one per batch step it is a member of (a whole pipeline prefill: one per
iteration, then its step's). Production never sets it; `shoal up`, the worker and the
local launcher pass the environment through unchanged (a local group test hands it to
`run_group(..., extra_env=...)`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import assert_never

from runner.engine.protocols import CancelSource

FAULT_ENV = "SHOAL_TEST_FAULT"


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Freeze:
    pass


@dataclass(frozen=True, slots=True)
class Die:
    pass


FaultAction = Sleep | Freeze | Die


LOAD = "load"  # the <poll> that means "while loading"


@dataclass(frozen=True, slots=True)
class Fault:
    rank: int
    poll: int | None  # None: while loading
    action: FaultAction


def parse_fault(value: str | None) -> Fault | None:
    if not value:
        return None
    kind, *fields = value.split(":")
    expected = {"sleep": 3, "freeze": 2, "die": 2}
    if expected.get(kind) != len(fields):
        raise ValueError(
            f"{FAULT_ENV}={value!r}: expected sleep:<rank>:<poll>:<seconds>, freeze:<rank>:<poll> or die:<rank>:<poll>"
        )
    action: FaultAction = Sleep(float(fields[2])) if kind == "sleep" else Freeze() if kind == "freeze" else Die()
    poll = None if fields[1] == LOAD else int(fields[1])
    return Fault(rank=int(fields[0]), poll=poll, action=action)


def perform(action: FaultAction) -> None:
    match action:
        case Sleep(seconds=seconds):
            time.sleep(seconds)
        case Freeze():
            os.kill(os.getpid(), signal.SIGSTOP)
        case Die():
            os.kill(os.getpid(), signal.SIGKILL)
        case _:
            assert_never(action)


class FaultInjector:
    """One per rank process: counts the cancel polls of the first task it sees, acts once at the chosen one.

    The shells wrap every cancel source they hand the engine with `around`, so the count covers
    every poll of the task.
    """

    def __init__(self, fault: Fault | None, rank: int, act: Callable[[FaultAction], None] = perform) -> None:
        self._fault = fault if fault is not None and fault.rank == rank else None
        self._act = act
        self._task: str | None = None
        self._polls = 0
        self._fired = False

    @classmethod
    def from_env(cls, rank: int, environ: Mapping[str, str] = os.environ) -> FaultInjector:
        return cls(parse_fault(environ.get(FAULT_ENV)), rank)

    def around(self, inner: CancelSource) -> CancelSource:
        """`inner`, or `inner` behind the fault when one is set for this rank."""
        return inner if self._fault is None else _InjectedCancel(self, inner)

    def loading(self) -> None:
        """Called by the shells once the rank started loading: acts here for a `load` fault."""
        if self._fault is not None and self._fault.poll is None and not self._fired:
            self._fired = True
            self._act(self._fault.action)

    def poll(self, task_id: str) -> None:
        if self._fault is None or self._fired:
            return
        if self._task is None:
            self._task = task_id
        if task_id != self._task:
            return
        if self._polls == self._fault.poll:
            self._fired = True
            self._act(self._fault.action)
        self._polls += 1


class _InjectedCancel:
    def __init__(self, injector: FaultInjector, inner: CancelSource) -> None:
        self._injector = injector
        self._inner = inner

    def is_cancelled(self, task_id: str) -> bool:
        self._injector.poll(task_id)
        return self._inner.is_cancelled(task_id)
