"""A task read back from the log, for when its payload has left the State (`events.retention`).

Services hold only the newest ended tasks whole; the log keeps every event. A task's own events
(its subjects, `shoal.ev.task.<id>.>`) are folded onto the nodes and instances of a current State,
which holds every instance the task can have run on (instances are never evicted), so the
origin checks pass exactly as they did live and the TaskInfo comes out as it was before eviction,
seqs included. A log whose head (the task's creation) was trimmed by retention no longer holds
the task: None, as for a task that never existed.
"""

from __future__ import annotations

from eventlog.log import EventLog
from events.fold import apply_live
from events.ids import InvalidId, TaskId, check_token
from events.state import FinishedTasks, State, TaskInfo
from events.subjects import task_events


async def task_from_log(log: EventLog, task_id: str, current: State) -> TaskInfo | None:
    """`task_id` as its events on the log tell it, folded in the context of `current`; None for
    an id that is no subject token (never put in a subject filter)."""
    try:
        check_token("task id", task_id)
    except InvalidId:
        return None
    state = State(nodes=current.nodes, instances=current.instances, finished=FinishedTasks(kept=0))
    async for seq, event, subject in log.deliveries(subjects=[task_events(task_id)], live=False):
        state, _refused = apply_live(state, seq, event, subject)  # seqs jump: other tasks' events in between
    return state.tasks.get(TaskId(task_id))
