"""The publish backlog's rules (pure): nothing dropped under the limit; past it a task fails once,
loudly, and nothing of it follows, its TaskCompleted least of all."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from events.catalogue import LogEvent, TaskCompleted, TaskFailed
from events.ids import TaskId
from runner.service.backlog import PublishBacklog, task_of
from tests.events.builders import Events

ev = Events()
runner = ev.task_rank("t1")


def _fail(task_id: TaskId, error: str) -> TaskFailed:
    return TaskFailed(env=runner.stamp(), task_id=task_id, error=error, rank=1)


def _completed(task_id: str) -> TaskCompleted:
    return TaskCompleted(env=runner.stamp(), task_id=TaskId(task_id), finish_reason="stop")


def test_under_the_limit_every_event_is_kept_in_order() -> None:
    backlog = PublishBacklog(3, _fail)
    events: list[LogEvent] = [ev.chunk("t1", index=0), ev.chunk("t1", index=1), _completed("t1")]
    assert [queued for event in events for queued in backlog.admit(event)] == events
    assert backlog.waiting == 3 and backlog.dropped == 0


def test_a_full_backlog_fails_the_task_once_and_drops_the_rest_of_it() -> None:
    backlog = PublishBacklog(1, _fail)
    assert backlog.admit(ev.chunk("t1", index=0)) != []
    [failed] = backlog.admit(ev.chunk("t1", index=1))
    assert isinstance(failed, TaskFailed) and failed.task_id == "t1"
    assert "could not publish" in failed.error and "publish_backlog_events = 1" in failed.error
    backlog.stored()
    backlog.stored()  # the log caught up: room again, but never for t1
    assert backlog.admit(ev.chunk("t1", index=2)) == []
    assert backlog.admit(_completed("t1")) == []
    assert backlog.admit(_completed("t2")) != []  # another task is not affected
    assert backlog.still_wanted(failed) and backlog.dropped == 3
    assert backlog.still_wanted(ev.chunk("t1", index=0))  # queued before the backlog filled: a prefix, sent


def test_a_queued_event_of_a_task_failed_later_is_not_sent() -> None:
    backlog = PublishBacklog(10, _fail)
    queued = backlog.admit(_completed("t1"))[0]
    failed = backlog.give_up(TaskId("t1"), "the log refused its ChunkGenerated", cut_queued=True)
    assert not backlog.still_wanted(queued) and backlog.still_wanted(failed)
    assert backlog.still_wanted(ev.runner(0, "ready"))


def test_task_less_events_past_the_limit_drop_except_status_changes() -> None:
    backlog = PublishBacklog(0, _fail)
    status = ev.runner(0, "ready")
    assert backlog.admit(status) == [status] and backlog.waiting == 1
    assert backlog.admit(ev.node("n1")) == []


@given(st.lists(st.tuples(st.sampled_from(["t1", "t2", "t3"]), st.booleans()), max_size=40), st.integers(0, 6))
def test_what_reaches_the_log_of_a_task_is_a_prefix_then_at_most_its_failure(
    steps: list[tuple[str, bool]], limit: int
) -> None:
    """Any interleaving of three tasks' chunks and the log's acknowledgements: per task, the kept
    events are the first ones it made, followed at most by one TaskFailed, and nothing is dropped
    while fewer than `limit` wait."""
    backlog = PublishBacklog(limit, _fail)
    made: dict[str, list[LogEvent]] = {}
    kept: dict[str, list[LogEvent]] = {}
    for task_id, acknowledge in steps:
        if acknowledge and backlog.waiting:
            backlog.stored()
            continue
        chunk = ev.chunk(task_id, index=len(made.get(task_id, [])))
        room = backlog.waiting < limit
        made.setdefault(task_id, []).append(chunk)
        admitted = backlog.admit(chunk)
        assert admitted == [chunk] or not room or task_id in backlog.lost
        kept.setdefault(task_id, []).extend(admitted)
    for task_id, events in kept.items():
        chunks = [e for e in events if not isinstance(e, TaskFailed)]
        assert chunks == made[task_id][: len(chunks)]
        failures = [e for e in events if isinstance(e, TaskFailed)]
        assert len(failures) <= 1 and (not failures or events[-1] is failures[0])
        assert all(task_of(e) == task_id for e in events)
