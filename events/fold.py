"""Folding a log: `fold`, `apply_live` and `Folder`, the fold of `apply` fast enough for a million
events; and the quarantine of the events the fold refuses.

`apply` is the definition: pure, one event, a new State, or a named error. A fold never stops at
a `PoisonEvent` (a forged origin, a dangling id, a contradiction): it quarantines it —
`quarantine` records (seq, kind, error, reason) in the State and advances its seq — so one bad
event in the log can neither stop a service from starting nor make two replicas disagree (the
record is part of the State every replica folds). Only a `SequenceGap`, the caller's bug, raises.

A fold of a long log spends most of its time on two kinds, `PrefillProgress` and
`ChunkGenerated`, each of which rebuilds the path to one task in the tasks map and a new State.
`Folder` applies exactly the same checks and updates (`task_runner_refusal`, `progress_update`,
`chunk_update`) to a transient mutation of the map and builds the State only when someone reads
`.state` or another kind of event arrives. Its `.state` always equals `fold` of the same events
(a property test holds it to that, poison included).

An event read from the bus comes with the subject it was stored on, which the server checked
against its publisher's identity: given it (`subject=`), the fold first holds the event to it
(`events.subjects.route_refusal`) and quarantines a mismatch as `Misrouted` — a node speaking for
another. None: the event did not come from the bus (a test, an export file), nothing to hold it to.
"""

from __future__ import annotations

from collections.abc import Iterable

import immutables
import msgspec

from events.apply import (
    ApplyError,
    ForbiddenOrigin,
    Misrouted,
    PoisonEvent,
    SequenceGap,
    UnknownTask,
    apply,
    chunk_update,
    progress_update,
)
from events.catalogue import ChunkGenerated, LogEvent, PrefillProgress, tag_of
from events.ids import TaskId
from events.origins import task_runner_refusal
from events.retention import is_evicted
from events.state import QUARANTINE_KEPT, Quarantined, State, TaskInfo
from events.subjects import route_refusal

replace = msgspec.structs.replace


def quarantine(state: State, seq: int, event: LogEvent, error: PoisonEvent) -> State:
    """`state` with `event` (at `seq`) recorded as refused and skipped."""
    record = Quarantined(seq=seq, kind=tag_of(event), error=type(error).__name__, reason=str(error))
    kept = (*state.quarantined, record)[-QUARANTINE_KEPT:]
    return replace(state, last_seq=seq, quarantined=kept, quarantined_count=state.quarantined_count + 1)


def check_route(event: LogEvent, subject: str | bytes | None) -> None:
    """Raise `Misrouted` when `event` did not arrive on its own subject (None: not from the bus)."""
    if subject is not None:
        refusal = route_refusal(subject, event)
        if refusal is not None:
            raise Misrouted(refusal)


def apply_or_quarantine(
    state: State, seq: int, event: LogEvent, subject: str | bytes | None = None
) -> tuple[State, PoisonEvent | None]:
    """`apply`, or the quarantine of an event it refuses (with the refusal, for the caller's log);
    `subject`: the one it was read from, when it was read from the bus."""
    try:
        if seq == state.last_seq + 1:  # a gap raises in apply, as without a subject
            check_route(event, subject)
        return apply(state, seq, event), None
    except PoisonEvent as exc:
        return quarantine(state, seq, event, exc), exc


def fold(events: Iterable[tuple[int, LogEvent]], state: State | None = None) -> State:
    """Fold (seq, event) pairs onto `state` (an empty State by default), quarantining poison."""
    current = state if state is not None else State()
    for seq, event in events:
        current, _poison = apply_or_quarantine(current, seq, event)
    return current


def apply_live(
    state: State, seq: int, event: LogEvent, subject: str | bytes | None = None
) -> tuple[State, ApplyError | None]:
    """For services following the stream: step over gaps (seqs of malformed or deleted messages),
    quarantine poison (a misrouted event too, given the `subject` it was read from), and return
    the error (a refusal, or a repeated seq) as a value for the caller to log, so one bad event
    never stops a consumer."""
    if seq > state.last_seq + 1:
        state = replace(state, last_seq=seq - 1)
    try:
        return apply_or_quarantine(state, seq, event, subject)
    except SequenceGap as exc:
        return state, exc


class Folder:
    def __init__(self, state: State | None = None) -> None:
        self._state = state if state is not None else State()
        self._tasks: immutables.MapMutation[TaskId, TaskInfo] | None = None
        self._last_seq: int = self._state.last_seq

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def state(self) -> State:
        if self._tasks is not None:
            self._state = replace(self._state, last_seq=self._last_seq, tasks=self._tasks.finish())
            self._tasks = None
        return self._state

    def add(self, seq: int, event: LogEvent, subject: str | bytes | None = None) -> PoisonEvent | None:
        """Fold one event (read from `subject`, when from the bus). An event `apply` refuses, or
        one off its subject, is quarantined and its refusal returned (for the caller to log); a
        `SequenceGap` raises, leaving the State as before the event."""
        kind = type(event)
        try:
            if kind is ChunkGenerated or kind is PrefillProgress:
                self._hot(seq, event, subject)  # pyright: ignore[reportArgumentType]
                return None
            if subject is not None and seq == self._last_seq + 1:  # a gap raises in apply, as without one
                check_route(event, subject)
            self._state = apply(self.state, seq, event)
            self._last_seq = seq
        except PoisonEvent as exc:
            self._state = quarantine(self.state, seq, event, exc)
            self._last_seq = seq
            return exc
        return None

    def skip_to(self, seq: int) -> None:
        """Account for every seq before `seq` without folding (a malformed or deleted message)."""
        if seq - 1 > self._last_seq:
            self._state = replace(self.state, last_seq=seq - 1)
            self._last_seq = seq - 1

    def add_all(self, events: Iterable[tuple[int, LogEvent]]) -> State:
        for seq, event in events:
            self.add(seq, event)
        return self.state

    def _hot(self, seq: int, event: PrefillProgress | ChunkGenerated, subject: str | bytes | None) -> None:
        """`apply` of the two frequent kinds, on the transient map: the same checks in the same
        order (seq, subject, task, origin), then `progress_update` / `chunk_update`."""
        if seq != self._last_seq + 1:
            raise SequenceGap(self._last_seq + 1, seq)
        if subject is not None:
            misrouted = route_refusal(subject, event)
            if misrouted is not None:
                raise Misrouted(misrouted)
        tasks = self._tasks
        if tasks is None:
            tasks = self._tasks = self._state.tasks.mutate()
        task_id = event.task_id
        task = tasks.get(task_id)
        if task is None:
            if is_evicted(self._state, task_id):  # finished is never stale here
                self._last_seq = seq
                return
            raise UnknownTask(task_id, tag_of(event))
        instances = self._state.instances  # never stale: only these two kinds are held back
        if isinstance(event, PrefillProgress):
            refusal = task_runner_refusal(instances, task, event.env.origin, event.rank)
            if refusal is not None:
                raise ForbiddenOrigin(tag_of(event), refusal)
            if not task.ended_seq:
                tasks.set(task_id, progress_update(task, event))
        else:
            refusal = task_runner_refusal(instances, task, event.env.origin, None, sampling=True)
            if refusal is not None:
                raise ForbiddenOrigin(tag_of(event), refusal)
            if not task.ended_seq:
                tasks.set(task_id, chunk_update(task, event))
        self._last_seq = seq
