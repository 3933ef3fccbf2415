"""Which waiting tasks the master hands to a model's instances next: a fair share between API keys.

An instance is handed a task while it holds fewer than `handed_ahead` tasks that have not started
(joined its batch: a rank's `PrefillStarted`), and fewer than its batch (`max_batch`, or 1 when it
does not batch: `RunnerSettings.batch_rows`) plus those in all. The ones handed ahead let a stream
that ends be replaced at the runner's next step from what it already holds, without waiting for
the master to hear of it; the bound on them holds whatever else limits the batch (its KV budget on
a large model admits fewer streams than `max_batch`). The other tasks wait at the master. Each free
place goes to the key (`TaskInfo.owner`) with the fewest tasks on the model's instances (running
and handed ahead alike, and those handed in this round), to its oldest waiting task; between keys
holding as many, to the one whose oldest waiting task is the oldest. One key's flood thus takes only
the places other keys leave: another key's request waits for the next place that frees (a stream's
length), not behind the whole flood. With one key, or none (an API without keys: every owner is ""),
the order is the log's, as before.

A task counts as many rows as it has completions (`TaskParams.n`, `task_rows`): its choices are
rows of the batch, admitted together, so a request of n=8 fills the places, and weighs on its
key's turn, as 8 requests do. A task is handed while its instance has a row free, even when its
rows are more (one never handed for want of room would wait for ever: `handed_ahead` may be fewer
rows than `n`); the instance then takes nothing more until its rows free.

The runner admits what it holds in log order (`runner/engine/batch_plan.py`: agreed from the log on
every rank); this module only chooses what it holds, and in which order it is handed over, so the
ranks' agreement is untouched. Pure: a function of the State, so a master that takes over decides
alike (`core.MasterCore.reconcile`).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Mapping, Sequence

from events.ids import InstanceId, KeyId, TaskId
from events.state import InstanceInfo, TaskInfo

HANDED_AHEAD_SHARE = 4  # an instance holds up to max_batch / 4 tasks not started ...
HANDED_AHEAD_AT_LEAST = 2  # ... and at least 2


def handed_ahead(max_batch: int) -> int:
    """How many tasks not yet started an instance holds at most: enough to refill the slots that
    free at one step while the master hears of them, few enough that a newcomer from another key
    waits behind only these."""
    return max(HANDED_AHEAD_AT_LEAST, max_batch // HANDED_AHEAD_SHARE)


def held_limit(instance: InstanceInfo) -> int:
    """The most rows `instance` holds (its tasks assigned, not ended: `task_rows`) at once."""
    rows = instance.settings.batch_rows
    return rows + handed_ahead(rows)


def task_rows(task: TaskInfo | None) -> int:
    """The rows of the batch a task takes: one per completion (`TaskParams.n`); 1 for one unknown."""
    return 1 if task is None else max(1, task.params.n)


def held_rows(instance: InstanceInfo, held: Mapping[TaskId, TaskInfo]) -> int:
    """The rows of the tasks `instance` holds; `held`: them, by id."""
    return sum(task_rows(held.get(task_id)) for task_id in instance.queue)


def started(task: TaskInfo) -> bool:
    """Whether `task` joined its instance's batch (a rank reported its prefill's start)."""
    return task.status not in ("created", "assigned")


def not_started(instance: InstanceInfo, held: Mapping[TaskId, TaskInfo]) -> int:
    """The rows of the tasks `instance` holds that have not joined its batch; `held`: them, by id."""
    return sum(
        task_rows(task) for task_id in instance.queue if (task := held.get(task_id)) is None or not started(task)
    )


def room_of(instance: InstanceInfo, held: Mapping[TaskId, TaskInfo]) -> int:
    """How many more rows `instance` may be handed now; `held`: the tasks it holds, by id."""
    ahead = handed_ahead(instance.settings.batch_rows) - not_started(instance, held)
    return max(0, min(held_limit(instance) - held_rows(instance, held), ahead))


def fair_assignments(
    waiting: Sequence[TaskInfo], instances: Sequence[InstanceInfo], held: Mapping[TaskId, TaskInfo]
) -> list[tuple[TaskId, InstanceId]]:
    """(task, instance) to hand over now, in order. `waiting`: the model's unassigned tasks, oldest
    first; `instances`: its ready instances, oldest placement first; `held`: every task the
    instances hold, by id. Each task goes to the instance holding the fewest rows (the oldest of
    those), while one has a row free; a key's load is its rows (`task_rows`)."""
    count_held = {i.instance_id: held_rows(i, held) for i in instances}
    room = {i.instance_id: room_of(i, held) for i in instances}
    load: Counter[KeyId] = Counter()
    for i in instances:
        for task_id in i.queue:
            if (task := held.get(task_id)) is not None:
                load[task.owner] += task_rows(task)
    by_owner: dict[KeyId, deque[TaskInfo]] = {}
    for task in waiting:
        by_owner.setdefault(task.owner, deque()).append(task)
    turns = [(load[owner], tasks[0].created_seq, owner) for owner, tasks in by_owner.items()]
    heapq.heapify(turns)
    handed: list[tuple[TaskId, InstanceId]] = []
    order = {i.instance_id: position for position, i in enumerate(instances)}
    while turns:
        open_ = [instance_id for instance_id, free in room.items() if free > 0]
        if not open_:
            break
        target = min(open_, key=lambda instance_id: (count_held[instance_id], order[instance_id]))
        count, _, owner = heapq.heappop(turns)
        queue = by_owner[owner]
        task = queue.popleft()
        handed.append((task.task_id, target))
        rows = task_rows(task)
        count_held[target] += rows
        room[target] -= rows
        if queue:
            heapq.heappush(turns, (count + rows, queue[0].created_seq, owner))
    return handed
