"""Test-only fault injection for the runner process. Off unless SHOAL_TEST_FAULT is set.

SHOAL_TEST_FAULT="sleep:<rank>:<poll>:<seconds>" makes rank <rank> sleep for <seconds> inside
its <poll>-th cancel poll of the first real task (poll 0 is the start agreement, poll i >= 1
prefill iteration i-1), so a
test can freeze one rank inside one prefill iteration, as a wedged collective would. Production
never sets it; `shoal up` and the worker pass the environment through unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from runner.engine.protocols import CancelSource

FAULT_ENV = "SHOAL_TEST_FAULT"


@dataclass(slots=True)
class SleepFault:
    rank: int
    poll: int
    seconds: float


def parse_fault(value: str | None) -> SleepFault | None:
    if not value:
        return None
    kind, *fields = value.split(":")
    if kind != "sleep" or len(fields) != 3:
        raise ValueError(f"{FAULT_ENV}={value!r}: expected sleep:<rank>:<poll>:<seconds>")
    return SleepFault(rank=int(fields[0]), poll=int(fields[1]), seconds=float(fields[2]))


class FaultyCancel:
    """Wraps a cancel source; sleeps once at the chosen poll of the first task it sees."""

    def __init__(self, inner: CancelSource, fault: SleepFault) -> None:
        self._inner = inner
        self._fault = fault
        self._task: str | None = None
        self._polls = 0
        self._fired = False

    def is_cancelled(self, task_id: str) -> bool:
        if self._task is None:
            self._task = task_id
        if task_id == self._task and not self._fired:
            if self._polls == self._fault.poll:
                self._fired = True
                time.sleep(self._fault.seconds)
            self._polls += 1
        return self._inner.is_cancelled(task_id)
