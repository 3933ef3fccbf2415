"""SIGSTOP that has taken effect when it returns.

`kill(pid, SIGSTOP)` returns before every thread of the process has stopped: each stops on its way
back from the kernel, and on a loaded machine one ran ~7 ms later (1 kill in 300 here, with two
busy loops beside it); a "frozen" nats-server then answered a PING sent 1 ms after its SIGSTOP,
and a test that meant to close against a silent server waited on a live one. `freeze` waits
until /proc shows every thread stopped.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def freeze(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOP `pid`, then wait (up to `timeout` seconds) until all its threads are stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} still has a running thread {timeout}s after SIGSTOP")
        time.sleep(0.001)


def _all_stopped(pid: int) -> bool:
    tasks = Path(f"/proc/{pid}/task")
    states = []
    for task in tasks.iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that exited meanwhile
            continue
    return all(state in ("T", "t") for state in states)
