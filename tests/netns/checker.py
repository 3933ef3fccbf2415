"""What every fault test ends with: the log against what the clients saw.

- every task either completed with its full text (the log's `ChunkGenerated` texts, in index
  order, equal what its stream delivered) or failed with a diagnosis (`TaskFailed.error` or a
  `TaskStalled.diagnosis`, and the client was told it failed);
- no acknowledged event lost: every task id a client was given (the API acknowledged its
  `TaskCreated`) is on the log, and every chunk a client received is the log's text;
- nothing decided twice: no task assigned more than once, no chunk index twice;
- no hang: every client call ended within its bound.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bench.netclient import ClientCall
from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from events.catalogue import (
    ChunkGenerated,
    TaskAssigned,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
)


@dataclass
class LogTask:
    created: bool = False
    chunks: dict[int, str] = field(default_factory=dict)
    duplicate_chunks: int = 0
    ended: str = ""  # the first terminal event, as the fold takes it: completed | cancelled | failed
    failed: str = ""
    diagnosis: str = ""
    assignments: int = 0

    @property
    def text(self) -> str:
        return "".join(self.chunks[index] for index in sorted(self.chunks))


async def read_tasks(endpoint: NatsEndpoint, timeout: float = 30.0) -> dict[str, LogTask]:
    """Every task on the log, folded from its events (replay as the admin, bounded)."""

    async def read() -> dict[str, LogTask]:
        tasks: dict[str, LogTask] = {}
        log = await EventLog.connect(endpoint, ensure=False, wait_seconds=10)
        try:
            async for _, event in log.replay():
                if isinstance(event, TaskCreated):
                    tasks.setdefault(event.task_id, LogTask()).created = True
                elif isinstance(event, ChunkGenerated):
                    task = tasks.setdefault(event.task_id, LogTask())
                    task.duplicate_chunks += event.index in task.chunks
                    task.chunks[event.index] = event.text
                elif isinstance(event, TaskAssigned):
                    tasks.setdefault(event.task_id, LogTask()).assignments += 1
                elif isinstance(event, TaskCompleted):  # a later terminal event is a race the fold ignores
                    task = tasks.setdefault(event.task_id, LogTask())
                    task.ended = task.ended or ("cancelled" if event.finish_reason == "cancelled" else "completed")
                elif isinstance(event, TaskFailed):
                    task = tasks.setdefault(event.task_id, LogTask())
                    if not task.ended:
                        task.ended, task.failed = "failed", event.error
                elif isinstance(event, TaskStalled):
                    tasks.setdefault(event.task_id, LogTask()).diagnosis = event.diagnosis
        finally:
            await log.close()
        return tasks

    return await asyncio.wait_for(read(), timeout)


def violations(calls: list[ClientCall], tasks: dict[str, LogTask]) -> list[str]:
    """Every way the clients and the log disagree with the guarantees (empty: all held)."""
    found: list[str] = []
    for call in calls:
        if call.outcome in ("hung", "broken"):
            found.append(
                f"client call {call.task_id or '(no id)'} {call.outcome} after {call.seconds:.1f}s: {call.error}"
            )
        if not call.task_id:
            if call.outcome != "refused":
                found.append(f"a call with no task id ended {call.outcome!r}: {call.error}")
            continue
        task = tasks.get(call.task_id)
        if task is None or not task.created:
            found.append(f"{call.task_id}: acknowledged to the client but no TaskCreated on the log")
            continue
        found += _task_violations(call, task)
    return found


def _task_violations(call: ClientCall, task: LogTask) -> list[str]:
    found: list[str] = []
    name = call.task_id
    if task.duplicate_chunks:
        found.append(f"{name}: {task.duplicate_chunks} chunk index(es) on the log twice")
    if task.assignments > 1:
        found.append(f"{name}: assigned {task.assignments} times")
    if task.ended == "completed":
        if call.outcome != "completed":
            found.append(f"{name}: completed on the log, but the client saw {call.outcome}: {call.error}")
        if task.text != call.text:
            found.append(f"{name}: log text {task.text!r} != streamed text {call.text!r}")
    elif task.ended == "failed":
        if call.outcome != "failed":
            found.append(f"{name}: failed on the log ({task.failed}), but the client saw {call.outcome}")
        if not (task.failed.strip() or task.diagnosis.strip()):
            found.append(f"{name}: failed without a diagnosis")
        if not task.text.startswith(call.text):
            found.append(f"{name}: the client received {call.text!r}, not a prefix of the log's {task.text!r}")
    else:
        found.append(
            f"{name}: neither completed nor failed on the log ({task.ended or 'not ended'}; client saw {call.outcome})"
        )
    return found
