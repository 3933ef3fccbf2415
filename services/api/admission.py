"""Admission: how many tasks of each model are queued, and the 429 that refuses one too many.

A model's queue is its tasks created but not ended (waiting for an instance, or on one), counted
from the folded State, so every API replica folding the same log counts alike. The count is kept
as the hub folds (one task's change per event, not a scan of every task per request), and it adds
the tasks this API has admitted whose `TaskCreated` it has not folded yet: in a burst, hundreds of
requests pass the check before the first of their events comes back from the log, and without
those the bound would hold only after the burst.

`max_queued_tasks_per_key` bounds one API key's share of a model's queue (the API without keys is
one key), so a client that floods it is refused while other keys' requests are still taken. Left
at 0, a key's share is all but the queue's last quarter (`KEPT_FOR_OTHER_KEYS`): one key's flood
can fill no more than that, and the rest is taken by the other keys' requests. The API without keys
has one caller, so its default share is the whole queue.

A task counts as many times as it has completions (`TaskParams.n`): each is a row of the batch,
so a request of n=8 fills as much of the queue as 8 requests do (`task_rows`); one larger than the
queue or its key's share is a 400 that says so, not a 429 no wait would clear.

`Retry-After` is when the model's queue is expected to free a slot: the mean interval between its
tasks' ends while it had tasks queued, taken from the events' own times (so replicas agree too).
"""

from __future__ import annotations

import math
from collections import Counter

from events.catalogue import LogEvent, TaskCreated
from events.ids import KeyId, TaskId
from events.state import State, TaskInfo
from services.api.schemas import RequestProblem

RETRY_AFTER_BOUNDS = (1, 60)  # seconds: a client never told "now", nor to wait longer than a minute
_SMOOTHING = 0.2  # weight of the newest interval in the running mean
NS = 1_000_000_000
NO_KEY = KeyId("")  # the owner of every task of an API without keys
KEPT_FOR_OTHER_KEYS = 4  # by default one key may not take the last 1/4 of a model's queue


def key_share(limit: int, key_limit: int, owner: KeyId) -> int | None:
    """The most tasks of one model `owner` may have queued, beyond which it gets 429 while other
    keys are still taken: `key_limit` if set; left at 0, the model's `limit` less a quarter kept
    for other keys (at least 1), and no share of its own for the API without keys (None)."""
    if key_limit > 0:
        return key_limit
    if owner == NO_KEY:
        return None
    return max(1, limit - limit // KEPT_FOR_OTHER_KEYS)


def task_rows(task: TaskCreated | TaskInfo) -> int:
    """What a task counts for in the queue: its completions, each a row of the batch."""
    return max(1, task.params.n)


def _is_live(state: State, task_id: TaskId) -> bool:
    task = state.tasks.get(task_id)
    return task is not None and not task.ended


class QueueBook:
    """Each model's queued tasks, as the hub folds the log, plus this API's admitted-not-yet-folded."""

    def __init__(self) -> None:
        self._live: Counter[str] = Counter()  # by model: created, not ended, in the folded State
        self._live_by_key: Counter[tuple[str, KeyId]] = Counter()  # the same by (model, owner)
        # (model, owner, rows) published by this API, not yet folded
        self._admitted: dict[TaskId, tuple[str, KeyId, int]] = {}
        self._last_end: dict[str, int] = {}  # by model: wall ns of the newest end while tasks stayed queued
        self._end_interval: dict[str, float] = {}  # by model: running mean of the seconds between ends

    @classmethod
    def of(cls, state: State) -> QueueBook:
        """The book of a State folded in one go (the hub's start)."""
        book = cls()
        live = [state.tasks[task_id] for task_id in state.live_tasks]  # not ended
        for task in live:
            book._live[task.model] += task_rows(task)
            book._live_by_key[task.model, task.owner] += task_rows(task)
        return book

    def queued(self, model: str) -> int:
        """Rows of `model` queued (`task_rows`: a task of n completions counts n)."""
        return self._live[model] + sum(rows for m, _, rows in self._admitted.values() if m == model)

    def queued_by(self, model: str, owner: KeyId) -> int:
        """`owner`'s share of `queued(model)`."""
        admitted = sum(rows for m, key, rows in self._admitted.values() if (m, key) == (model, owner))
        return self._live_by_key[model, owner] + admitted

    def folded(self, before: State, after: State, event: LogEvent) -> None:
        """The State moved from `before` to `after` by `event` (`after is before` if refused)."""
        if isinstance(event, TaskCreated):
            self._admitted.pop(event.task_id, None)  # folded (or refused): the State counts it now, or never
        task_id: TaskId | None = getattr(event, "task_id", None)
        if task_id is None:
            return
        change = _is_live(after, task_id) - _is_live(before, task_id)
        if change == 0:
            return
        task = after.tasks.get(task_id) or before.tasks[task_id]
        model = task.model
        self._live[model] += change * task_rows(task)
        self._live_by_key[model, task.owner] += change * task_rows(task)
        if change < 0:
            self._ended(model, event.env.wall_time)

    def _ended(self, model: str, at: int) -> None:
        last = self._last_end.pop(model, None)
        if last is not None and at > last:
            interval = (at - last) / NS
            mean = self._end_interval.get(model)
            self._end_interval[model] = interval if mean is None else mean + _SMOOTHING * (interval - mean)
        if self._live[model] > 0:  # still busy: the next end measures how fast the queue drains
            self._last_end[model] = at

    def retry_after_seconds(self, model: str) -> int:
        low, high = RETRY_AFTER_BOUNDS
        return min(high, max(low, math.ceil(self._end_interval.get(model, low))))

    def refusal(
        self, model: str, limit: int, owner: KeyId = NO_KEY, key_limit: int = 0, rows: int = 1
    ) -> RequestProblem | None:
        """The 429 for one more task of `model` from `owner` counting `rows` (`task_rows`), or None
        while the model's queue has room (`limit`) and so has the key's share of it (`key_share`);
        a 400 for a task larger than either, which no wait would let in."""
        share = key_share(limit, key_limit, owner)
        bound = limit if share is None else min(limit, share)
        if rows > bound:
            return RequestProblem(
                400,
                f"n={rows} completions count as {rows} queued tasks, over the {bound} this API key may queue "
                "(max_queued_tasks, max_queued_tasks_per_key): ask for fewer",
                param="n",
            )
        queued = self.queued(model)
        if queued + rows > limit:
            return self._full(model, f"model {model!r} has {queued} of {limit} queued tasks (max_queued_tasks)")
        if share is not None and (mine := self.queued_by(model, owner)) + rows > share:
            setting = (
                "max_queued_tasks_per_key"
                if key_limit > 0
                else (
                    f"the default share: all but the last {limit - share} of max_queued_tasks {limit}, kept for other API "
                    "keys; set max_queued_tasks_per_key to change it"
                )
            )
            return self._full(model, f"model {model!r} has {mine} of this API key's {share} queued tasks ({setting})")
        return None

    def _full(self, model: str, said: str) -> RequestProblem:
        retry = self.retry_after_seconds(model)
        return RequestProblem(
            429, f"{said}; retry after {retry} s", code="queue_full", headers={"Retry-After": str(retry)}
        )

    def admit(self, task: TaskCreated, limit: int, key_limit: int = 0) -> None:
        """Count `task` in its model's queue before it is published; raises the 429 if full."""
        problem = self.refusal(task.model, limit, task.owner, key_limit, task_rows(task))
        if problem is not None:
            raise problem
        self._admitted[task.task_id] = (task.model, task.owner, task_rows(task))

    def withdraw(self, task_id: TaskId) -> None:
        """A task admitted but never published (the log refused the write)."""
        self._admitted.pop(task_id, None)
