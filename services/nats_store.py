"""One nats-server per JetStream store: who holds a store now, and whether its owner still runs.

The embedded server writes its pid to `<store>/nats-server.pid` (`-P`) and the process that
started it writes its own to `<store>/nats-server.owner`. A server runs in its own session (so
Ctrl-C reaches its owner first), and therefore outlives an owner that is killed: such a server
is a leftover, whose parent is no longer its owner. `ps` answers on Linux and macOS alike.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PID_FILE = "nats-server.pid"
OWNER_FILE = "nats-server.owner"
LOG_FILE = "nats-server.log"


@dataclass(frozen=True, slots=True)
class StoreHolder:
    pid: int
    parent: int
    port: str  # as on its command line ("" when absent)
    owner_runs: bool  # its parent is the process that started it: in use, not a leftover


def store_holder(store_dir: Path, binary: str, pid_path: Path, owner_path: Path) -> StoreHolder | None:
    """The server running on `store_dir`, or None (none ever, or it is gone, or the pid file's
    pid is some other process now)."""
    pid = _read_pid(pid_path)
    if pid is None or pid == os.getpid():
        return None
    found = command_and_parent(pid)
    if found is None:
        return None
    command, parent = found
    if binary not in command or str(store_dir) not in command:
        return None
    return StoreHolder(pid, parent, _flag_value(command, "-p"), owner_runs=parent == _read_pid(owner_path))


def record_owner(owner_path: Path) -> None:
    owner_path.write_text(f"{os.getpid()}\n")


def stop_process(pid: int, timeout: float) -> None:
    """SIGTERM (and SIGCONT, for a frozen one), then SIGKILL after `timeout`."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while command_and_parent(pid) is not None:
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def command_and_parent(pid: int) -> tuple[str, int] | None:
    """The command line and parent pid of a running process, or None once it is gone (a zombie
    counts as gone)."""
    try:
        out = subprocess.run(
            ["ps", "-ww", "-o", "stat=", "-o", "ppid=", "-o", "command=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = out.stdout.strip().split(None, 2)
    if out.returncode != 0 or len(fields) < 3 or fields[0].startswith("Z"):
        return None
    return fields[2], int(fields[1])


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _flag_value(command: str, flag: str) -> str:
    words = command.split()
    return words[words.index(flag) + 1] if flag in words[:-1] else ""
