"""Each runner's stderr, kept in a file of its own under the worker's data dir.

A rank that dies, hangs or ends a task without a word on the log leaves its reason in its stderr
(a traceback, loguru's lines); the worker reads that pipe anyway (the exit report's tail), so it
also writes every line to `<data_dir>/runner-logs/<node_id>/<instance_id>.rank<r>.log`. A file
is bounded: past half of `runner_log_bytes` it becomes `<name>.1` (replacing the older one) and a
new one starts, so a runner never holds more than `runner_log_bytes` on disk. Only the newest
`RUNNER_LOGS_KEPT` runners' files are kept per node; older ones are removed when a runner starts.
`shoal diagnose` names these files (the node announces its directory in `NodeJoined.runner_logs`).
"""

from __future__ import annotations

import os
from pathlib import Path

from events.ids import InstanceId

RUNNER_LOGS_DIRNAME = "runner-logs"
RUNNER_LOG_BYTES = 4 << 20  # `runner_log_bytes`: a runner's stderr on disk, its rotated half included
RUNNER_LOG_BYTES_LEAST = 4096  # room for a traceback: less keeps too little to explain anything
RUNNER_LOGS_KEPT = 32  # runners per node whose files are kept (one instance of 32 ranks, or 32 restarts)
ROTATED_SUFFIX = ".1"


def runner_logs_dir(data_dir: Path, node_id: str) -> Path:
    """Where the node `node_id` keeps its runners' stderr: one directory per node, since the
    workers of one host (`shoal up --workers N`, a test cluster) share a data dir."""
    return data_dir / RUNNER_LOGS_DIRNAME / node_id


def runner_log_name(instance_id: InstanceId | str, rank: int) -> str:
    return f"{instance_id}.rank{rank}.log"


class BoundedLog:
    """An append-only text file that, with its one rotated predecessor, holds at most `limit`
    bytes: a line that would take the file past `limit // 2` first moves it to `<path>.1`.
    A line longer than half the limit is cut (its end dropped, marked)."""

    def __init__(self, path: Path, limit: int) -> None:
        if limit < RUNNER_LOG_BYTES_LEAST:
            raise ValueError(f"runner_log_bytes: {limit} keeps too little; give {RUNNER_LOG_BYTES_LEAST} or more")
        self.path = path
        self.half = limit // 2
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")
        self.size = self._file.tell()

    def write_line(self, line: str) -> None:
        data = (line.rstrip("\n") + "\n").encode(errors="replace")
        if len(data) > self.half:
            marker = b" [cut]\n"
            data = data[: max(0, self.half - len(marker))] + marker
            data = data[: self.half]
        if self.size and self.size + len(data) > self.half:
            self._rotate()
        self._file.write(data)
        self._file.flush()  # a SIGKILLed worker loses nothing it had read
        self.size += len(data)

    def close(self) -> None:
        self._file.close()

    def _rotate(self) -> None:
        self._file.close()
        os.replace(self.path, self.path.with_name(self.path.name + ROTATED_SUFFIX))
        self._file = self.path.open("ab")
        self.size = 0


def prune_runner_logs(directory: Path, keep: int = RUNNER_LOGS_KEPT) -> list[Path]:
    """Remove all but the `keep` newest runners' files (by modification time) from `directory`;
    returns what was removed. A file vanishing meanwhile (another worker pruning) is no error."""
    if not directory.is_dir():
        return []
    current = [p for p in directory.iterdir() if p.name.endswith(".log")]
    current.sort(key=_mtime, reverse=True)
    removed: list[Path] = []
    for path in current[keep:]:
        for victim in (path, path.with_name(path.name + ROTATED_SUFFIX)):
            try:
                victim.unlink()
                removed.append(victim)
            except FileNotFoundError:
                pass
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
