"""The runner's events waiting for the log, where a task's chunks made faster than the log takes
them become one event.

With many streams decoding in one batch, the sampling rank makes a `ChunkGenerated` per task per
step; when the bridge is behind (the log's round trip is slower than a step, or NATS is away),
they pile up. Sending each on its own would turn the log into an event storm exactly when it is
slowest, so a chunk that finds its task's previous event still waiting here, and that event a
chunk, joins it: text, token ids and logprobs concatenated, the first's index and envelope.

Invariants (`tests/runner/test_coalesce.py`):
- per task, the events that leave are those that came, in order, with runs of adjacent chunks
  merged: the concatenated text, token ids and logprobs of a task are unchanged, and nothing of a
  task (its `TaskCompleted` least of all) overtakes an earlier event of it;
- only an event still waiting is ever merged into: once popped it may be in the log, and its
  resends carry its id and content unchanged. A merged chunk keeps the first's event id, which
  was never handed to the log, so it cannot collide with one that was;
- an event of no task (a status change) is a barrier: no chunk moves across it;
- a merged chunk stays small enough for one NATS message (`MERGED_TOKENS_MAX`, `MERGED_TEXT_MAX`).

Pure (no I/O, no lock): the bridge uses it from its event loop only.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import NamedTuple

import msgspec

from events.catalogue import ChunkGenerated, LogEvent
from events.ids import TaskId
from runner.service.backlog import task_of

MERGED_TOKENS_MAX = 256  # with 20 top logprobs per token, still well under NATS's 1 MiB payload
MERGED_TEXT_MAX = 16_384  # characters: at most 64 KiB of UTF-8


def merged_chunk(first: ChunkGenerated, then: ChunkGenerated) -> ChunkGenerated | None:
    """`first` followed by `then` as one chunk, or None when they must stay two: another task, not
    contiguous, logprobs on one only, or too large together."""
    if then.task_id != first.task_id or then.index != first.index + len(first.token_ids):
        return None
    if (first.logprobs is None) != (then.logprobs is None):
        return None
    if len(first.token_ids) + len(then.token_ids) > MERGED_TOKENS_MAX:
        return None
    if len(first.text) + len(then.text) > MERGED_TEXT_MAX:
        return None
    logprobs = None if first.logprobs is None or then.logprobs is None else [*first.logprobs, *then.logprobs]
    return msgspec.structs.replace(
        first, text=first.text + then.text, token_ids=[*first.token_ids, *then.token_ids], logprobs=logprobs
    )


class Pending(NamedTuple):
    event: LogEvent
    made: int  # how many of the runner's events it stands for (1, or the chunks merged into it)


class PendingEvents:
    """Events admitted by the backlog and not yet handed to the log, oldest first."""

    def __init__(self) -> None:
        self._waiting: OrderedDict[int, Pending] = OrderedDict()
        self._newest_of_task: dict[TaskId, int] = {}  # a task's newest waiting event, by slot
        self._slots = itertools.count()

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, event: LogEvent) -> bool:
        """Queue `event`; True when it joined its task's waiting chunk instead (no new event)."""
        task_id = task_of(event)
        if task_id is None:
            self._newest_of_task.clear()  # a barrier: no chunk of before merges with one of after
        else:
            slot = self._newest_of_task.get(task_id)
            if slot is not None and isinstance(event, ChunkGenerated):
                waiting = self._waiting[slot]
                if isinstance(waiting.event, ChunkGenerated):
                    merged = merged_chunk(waiting.event, event)
                    if merged is not None:
                        self._waiting[slot] = Pending(merged, waiting.made + 1)
                        return True
        slot = next(self._slots)
        self._waiting[slot] = Pending(event, 1)
        if task_id is not None:
            self._newest_of_task[task_id] = slot
        return False

    def pop_distinct(self, limit: int) -> list[Pending]:
        """The oldest waiting events, at most `limit`, at most one per task, handed to the log
        together (`Appender.append_pipelined`): the first one always; then each next one while it
        belongs to a task not taken yet. An event of no task goes alone. So if one of them is
        refused, no later event of its task was sent beside it."""
        taken: list[Pending] = []
        tasks: set[TaskId] = set()
        while self._waiting and len(taken) < max(1, limit):
            task_id = task_of(next(iter(self._waiting.values())).event)
            if taken and (task_id is None or task_id in tasks):
                break
            popped = self.pop()
            assert popped is not None
            taken.append(popped)
            if task_id is None:
                break
            tasks.add(task_id)
        return taken

    def pop(self) -> Pending | None:
        """The oldest waiting event, handed to the log: from now on nothing merges into it."""
        if not self._waiting:
            return None
        slot, pending = self._waiting.popitem(last=False)
        task_id = task_of(pending.event)
        if task_id is not None and self._newest_of_task.get(task_id) == slot:
            del self._newest_of_task[task_id]
        return pending
