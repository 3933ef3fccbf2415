"""`Folder`: the fold of `apply`, fast enough for a million events.

`apply` is the definition: pure, one event, a new State. A fold of a long log spends most of its
time on two kinds, `PrefillProgress` and `ChunkGenerated`, each of which rebuilds the path to one
task in the tasks map and a new State. `Folder` applies exactly the same updates
(`progress_update`, `chunk_update`) to a transient mutation of the map and builds the State only
when someone reads `.state` or another kind of event arrives. Its `.state` always equals the
sequential fold of the same events (a property test holds it to that).
"""

from __future__ import annotations

from collections.abc import Iterable

import immutables
import msgspec

from events.apply import SequenceGap, UnknownTask, apply, chunk_update, progress_update
from events.catalogue import ChunkGenerated, LogEvent, PrefillProgress
from events.ids import TaskId
from events.state import State, TaskInfo


class Folder:
    def __init__(self, state: State | None = None) -> None:
        self._state = state if state is not None else State()
        self._tasks: immutables.MapMutation[TaskId, TaskInfo] | None = None
        self._last_seq = self._state.last_seq

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def state(self) -> State:
        if self._tasks is not None:
            self._state = msgspec.structs.replace(self._state, last_seq=self._last_seq, tasks=self._tasks.finish())
            self._tasks = None
        return self._state

    def add(self, seq: int, event: LogEvent) -> None:
        """Fold one event; raises what `apply` raises, leaving the State as before the event."""
        kind = type(event)
        if kind is PrefillProgress or kind is ChunkGenerated:
            self._hot(seq, event)  # pyright: ignore[reportArgumentType]
        else:
            self._state = apply(self.state, seq, event)
            self._last_seq = seq

    def skip_to(self, seq: int) -> None:
        """Account for every seq before `seq` without folding (a malformed or deleted message)."""
        if seq - 1 > self._last_seq:
            self._state = msgspec.structs.replace(self.state, last_seq=seq - 1)
            self._last_seq = seq - 1

    def add_all(self, events: Iterable[tuple[int, LogEvent]]) -> State:
        for seq, event in events:
            self.add(seq, event)
        return self.state

    def _hot(self, seq: int, event: PrefillProgress | ChunkGenerated) -> None:
        if seq != self._last_seq + 1:
            raise SequenceGap(self._last_seq + 1, seq)
        tasks = self._tasks
        if tasks is None:
            tasks = self._tasks = self._state.tasks.mutate()
        task = tasks.get(event.task_id)
        if task is None:
            raise UnknownTask(
                event.task_id, "prefill_progress" if type(event) is PrefillProgress else "chunk_generated"
            )
        if not task.ended_seq:
            if type(event) is PrefillProgress:
                tasks.set(event.task_id, progress_update(task, event))  # pyright: ignore[reportArgumentType]
            else:
                tasks.set(event.task_id, chunk_update(task, event))  # pyright: ignore[reportArgumentType]
        self._last_seq = seq
