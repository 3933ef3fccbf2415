"""The request deadline (`request_timeout_seconds`): the master fails a task still going past it,
waiting or running, with a `TaskFailed` that says so; the ranks' late `TaskCompleted(cancelled)`
then changes nothing, so the stored result stays the honest one."""

from __future__ import annotations

from events.apply import apply
from events.catalogue import LogEvent, TaskCompleted, TaskFailed
from events.ids import TaskId
from services.master.core import MasterPolicy
from services.master.watchdog import Liveness, tick
from tests.events.builders import fake_stamper
from tests.services.master.test_core import Cluster


def _tick(c: Cluster) -> list[LogEvent]:
    liveness = Liveness(nodes={node: c.clock.now_ns for node in c.state.nodes})
    return tick(c.state, c.clock.now_ns, liveness, c.policy, fake_stamper("master", c.clock))  # pyright: ignore[reportArgumentType]


def test_a_running_task_past_its_deadline_fails_saying_so_and_its_ranks_late_cancel_changes_nothing() -> None:
    c = Cluster(MasterPolicy(request_timeout_seconds=20, task_stall_seconds=30))
    c.ready_instance()
    c.feed(TaskCompleted(env=c.ev.task_rank("warm").stamp(), task_id=TaskId("warm"), finish_reason="stop"))
    c.feed(c.ev.created("t1"), c.ev.started("t1", 0), c.ev.progress("t1", rank=0), c.ev.chunk("t1"))
    c.clock.advance(19)
    assert _tick(c) == []
    c.clock.advance(2)
    failed = [e for e in _tick(c) if isinstance(e, TaskFailed)]
    assert [(e.task_id, e.deadline, e.error) for e in failed] == [
        ("t1", True, "request timed out after 20 s (request_timeout_seconds)")
    ]
    c.feed(*failed)
    late = TaskCompleted(env=c.ev.task_rank("t1").stamp(), task_id=TaskId("t1"), finish_reason="cancelled")
    c.state = apply(c.state, c.state.last_seq + 1, late)
    task = c.state.tasks[TaskId("t1")]
    assert (task.status, task.error, task.finish_reason) == ("failed", failed[0].error, None)


def test_a_waiting_task_meets_its_deadline_before_the_assign_timeout() -> None:
    c = Cluster(MasterPolicy(request_timeout_seconds=5, assign_timeout_seconds=60))
    c.feed(c.ev.node("n1"), c.ev.created("t1"))  # placed, never ready
    c.clock.advance(6)
    assert [(type(e).__name__, getattr(e, "deadline", None)) for e in _tick(c)] == [("TaskFailed", True)]


def test_no_deadline_when_it_is_zero_but_the_assign_timeout_still_holds() -> None:
    c = Cluster(MasterPolicy(request_timeout_seconds=0, assign_timeout_seconds=60))
    c.feed(c.ev.node("n1"), c.ev.created("t1"))
    c.clock.advance(59)
    assert _tick(c) == []
    c.clock.advance(2)
    out = _tick(c)
    assert [(type(e).__name__, getattr(e, "deadline", None)) for e in out] == [("TaskFailed", False)]
