"""Admission's pure core (`services/api/admission.py`): each model's queue as the hub folds the
log, the tasks this API admitted but has not folded yet, and the 429 beyond `max_queued_tasks` or
beyond one key's share (`max_queued_tasks_per_key`)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.catalogue import LogEvent, TaskCancelled, TaskCompleted, TaskCreated, TaskFailed
from events.fold import apply_live
from events.ids import KeyId, TaskId
from events.state import State
from services.api.admission import NO_KEY, RETRY_AFTER_BOUNDS, QueueBook, key_share
from tests.events.builders import Events, FakeClock

MODELS = ("tiny", "big")
KEYS = ("alice", "bob")


class Folding:
    """A State and its QueueBook, moved together as the hub moves them."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.ev = Events(self.clock)
        self.state = State()
        self.book = QueueBook()
        self.seq = 0
        self.feed(self.ev.node("n1"), self.ev.placed("i1", nodes=("n1",)))

    def feed(self, *events: LogEvent) -> None:
        for event in events:
            self.seq += 1
            before = self.state
            self.state, _error = apply_live(before, self.seq, event)
            self.book.folded(before, self.state, event)

    def counted(self, model: str) -> int:
        """Rows: a task of n completions counts n."""
        return sum(t.params.n for t in self.state.tasks.values() if t.model == model and not t.ended)

    def counted_by_key(self) -> list[int]:
        live = [t for t in self.state.tasks.values() if not t.ended]
        return [sum(t.params.n for t in live if t.model == m and t.owner == k) for m in MODELS for k in KEYS]

    def end(self, task_id: str) -> None:
        self.feed(TaskCompleted(env=self.ev.master.stamp(), task_id=TaskId(task_id), finish_reason="stop"))


# One step: (what happens, to which of a few tasks, of which model).
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "assign", "complete", "fail", "cancel"]), st.integers(0, 5), st.sampled_from(MODELS)
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_the_books_count_equals_a_recount_of_the_state_after_every_event(steps: list[tuple[str, int, str]]) -> None:
    f = Folding()
    for action, n, model in steps:
        task_id = TaskId(f"t{n}")
        known = task_id in f.state.tasks
        match action:
            case "create" if not known:
                f.feed(choices(owned(f.ev.created(task_id, model=model), KEYS[n % 2]), 1 + n % 3))
            case "assign" if known:
                f.feed(f.ev.assigned(task_id, "i1"))
            case "complete" if known:
                f.feed(TaskCompleted(env=f.ev.task_rank(task_id).stamp(), task_id=task_id, finish_reason="stop"))
            case "fail" if known:
                f.feed(TaskFailed(env=f.ev.master.stamp(), task_id=task_id, error="x"))
            case "cancel" if known:
                f.feed(TaskCancelled(env=f.ev.api.stamp(), task_id=task_id, reason="api"))
            case _:
                continue
        assert [f.book.queued(m) for m in MODELS] == [f.counted(m) for m in MODELS]
        assert [f.book.queued_by(m, KeyId(k)) for m in MODELS for k in KEYS] == f.counted_by_key()
    rebuilt = QueueBook.of(f.state)
    assert [rebuilt.queued(m) for m in MODELS] == [f.counted(m) for m in MODELS]
    assert [rebuilt.queued_by(m, KeyId(k)) for m in MODELS for k in KEYS] == f.counted_by_key()


def test_tasks_admitted_but_not_yet_folded_count_so_a_burst_meets_the_bound() -> None:
    f = Folding()
    burst = [f.ev.created(f"t{i}") for i in range(5)]
    for task in burst[:3]:
        f.book.admit(task, limit=3)  # none of them folded yet
    problem = f.book.refusal("tiny", limit=3)
    assert problem is not None and problem.status == 429
    assert problem.message == "model 'tiny' has 3 of 3 queued tasks (max_queued_tasks); retry after 1 s"
    assert problem.headers == {"Retry-After": "1"} and problem.code == "queue_full"
    f.feed(*burst[:3])  # folded: now counted by the State, not twice
    assert f.book.queued("tiny") == 3 and f.book.refusal("big", limit=3) is None
    f.book.withdraw(burst[3].task_id)  # never admitted: nothing to undo
    f.end("t0")
    assert f.book.refusal("tiny", limit=3) is None


def test_a_task_the_log_refused_leaves_the_queue() -> None:
    f = Folding()
    task = f.ev.created("t1")
    f.book.admit(task, limit=1)
    f.book.withdraw(task.task_id)
    assert f.book.queued("tiny") == 0


def test_retry_after_is_the_interval_between_ends_while_the_queue_stayed_busy() -> None:
    f = Folding()
    f.feed(*(f.ev.created(f"t{i}") for i in range(4)))
    for i in range(3):
        f.clock.advance(7)
        f.end(f"t{i}")
    assert f.book.retry_after_seconds("tiny") == 7
    f.clock.advance(7)
    f.end("t3")
    f.clock.advance(3600)  # the queue was empty for an hour: no drain rate in that
    f.feed(f.ev.created("t9"))
    f.clock.advance(7)
    f.end("t9")
    assert f.book.retry_after_seconds("tiny") == 7
    assert f.book.retry_after_seconds("big") == RETRY_AFTER_BOUNDS[0]


def test_created_events_refused_by_the_fold_release_their_admission() -> None:
    f = Folding()
    task = f.ev.created("t1")
    f.feed(task)
    again = TaskCreated(env=f.ev.api.stamp(), task_id=task.task_id, model="tiny", messages=task.messages)
    f.book.admit(again, limit=5)
    f.feed(again)  # a duplicate id: quarantined, never a second queued task
    assert f.book.queued("tiny") == 1


def owned(task: TaskCreated, owner: str) -> TaskCreated:
    return msgspec.structs.replace(task, owner=KeyId(owner))


def choices(task: TaskCreated, n: int) -> TaskCreated:
    return msgspec.structs.replace(task, params=msgspec.structs.replace(task.params, n=n))


def test_a_task_of_n_completions_counts_n_rows_and_one_larger_than_the_bound_is_a_400() -> None:
    f = Folding()
    wide = choices(f.ev.created("w"), 4)
    f.book.admit(wide, limit=6)
    assert f.book.queued("tiny") == 4
    f.feed(wide)
    assert f.book.queued("tiny") == 4  # folded: counted by the State, not twice
    problem = f.book.refusal("tiny", 6, rows=3)  # 4 + 3 > 6
    assert problem is not None and problem.status == 429
    assert f.book.refusal("tiny", 6, rows=2) is None
    too_many = f.book.refusal("tiny", 6, rows=7)  # no wait would let it in
    assert too_many is not None and too_many.status == 400 and too_many.param == "n"
    share = f.book.refusal("tiny", 16, KeyId("alice"), key_limit=2, rows=3)  # over the key's own share
    assert share is not None and share.status == 400 and "n=3" in share.message
    f.end("w")
    assert f.book.queued("tiny") == 0


def test_one_keys_flood_is_refused_while_another_key_is_still_taken() -> None:
    f = Folding()
    alice = [owned(f.ev.created(f"a{i}"), "alice") for i in range(3)]
    f.book.admit(alice[0], limit=10, key_limit=2)
    f.feed(alice[0])  # folded: counted by the State, by owner
    f.book.admit(alice[1], limit=10, key_limit=2)  # admitted, not folded yet
    problem = f.book.refusal("tiny", 10, KeyId("alice"), key_limit=2)
    assert problem is not None and problem.status == 429 and problem.code == "queue_full"
    assert problem.message == (
        "model 'tiny' has 2 of this API key's 2 queued tasks (max_queued_tasks_per_key); retry after 1 s"
    )
    assert f.book.refusal("tiny", 10, KeyId("bob"), key_limit=2) is None  # the queue has room for others
    assert f.book.refusal("big", 10, KeyId("alice"), key_limit=2) is None  # a share is per model
    assert f.book.refusal("tiny", 10, KeyId("alice")) is None  # the default share: 8 of 10
    f.book.admit(owned(f.ev.created("b0"), "bob"), limit=10, key_limit=2)
    f.feed(alice[1])
    f.end("a0")  # one of alice's ends: her share has room again
    assert f.book.queued_by("tiny", KeyId("alice")) == 1 and f.book.queued_by("tiny", KeyId("bob")) == 1
    assert f.book.refusal("tiny", 10, KeyId("alice"), key_limit=2) is None
    rebuilt = QueueBook.of(f.state)  # the hub's start: the shares from the State alone (bob's not folded)
    assert rebuilt.queued_by("tiny", KeyId("alice")) == 1 and rebuilt.queued_by("tiny", KeyId("bob")) == 0


def test_by_default_a_key_leaves_the_last_quarter_of_the_queue_to_other_keys() -> None:
    f = Folding()
    for i in range(6):  # a share of 6 of 8: two places kept for other keys
        assert f.book.refusal("tiny", 8, KeyId("alice")) is None
        f.book.admit(owned(f.ev.created(f"a{i}"), "alice"), limit=8)
    problem = f.book.refusal("tiny", 8, KeyId("alice"))
    assert problem is not None and problem.status == 429 and problem.headers == {"Retry-After": "1"}
    assert problem.message == (
        "model 'tiny' has 6 of this API key's 6 queued tasks (the default share: all but the last 2 of "
        "max_queued_tasks 8, kept for other API keys; set max_queued_tasks_per_key to change it); retry after 1 s"
    )
    for i in range(2):  # the places kept are taken by another key, up to the model's bound
        f.book.admit(owned(f.ev.created(f"b{i}"), "bob"), limit=8)
    assert f.book.refusal("tiny", 8, KeyId("bob")) is not None and f.book.queued("tiny") == 8
    assert f.book.refusal("tiny", 8, KeyId("alice"), key_limit=8) is not None  # an explicit share: the bound


def test_the_default_share_of_an_api_without_keys_is_the_whole_queue() -> None:
    f = Folding()
    for i in range(8):
        f.book.admit(f.ev.created(f"t{i}"), limit=8)  # owner: NO_KEY
    problem = f.book.refusal("tiny", 8, NO_KEY)
    assert problem is not None and "(max_queued_tasks)" in problem.message


@pytest.mark.parametrize(
    ("limit", "key_limit", "owner", "share"),
    [
        (64, 0, "alice", 48),
        (8, 0, "alice", 6),
        (3, 0, "alice", 3),
        (1, 0, "alice", 1),
        (64, 0, "", None),
        (64, 5, "alice", 5),
        (64, 5, "", 5),
        (4, 100, "alice", 100),
    ],
)
def test_a_keys_share(limit: int, key_limit: int, owner: str, share: int | None) -> None:
    assert key_share(limit, key_limit, KeyId(owner)) == share


def test_the_models_bound_comes_first() -> None:
    f = Folding()
    f.book.admit(owned(f.ev.created("a0"), "alice"), limit=1, key_limit=5)
    problem = f.book.refusal("tiny", 1, KeyId("bob"), key_limit=5)
    assert problem is not None and "(max_queued_tasks)" in problem.message
