"""The whole-text check the fault tests end with: it passes a whole task and names each way a
completed task can lack text (a lost chunk, a chunk after the end, a token count, a client)."""

from __future__ import annotations

import msgspec

from events.catalogue import ChoiceEnd, LogEvent, TaskCompleted, TaskFailed, Usage
from events.fold import fold
from events.ids import TaskId
from services.ops.delivery import delivery_problems
from tests.events.builders import Events


def _check(events: list[LogEvent], delivered: dict[str, str] | None = None) -> list[str]:
    numbered = list(enumerate(events, 1))
    return delivery_problems(numbered, fold(numbered), delivered)


def _task(ev: Events, *tail: LogEvent) -> list[LogEvent]:
    return [ev.node("n1"), ev.node("n2"), ev.placed("i1"), ev.created("t1"), ev.assigned("t1", "i1"), *tail]


def _completed(ev: Events, tokens: int) -> TaskCompleted:
    usage = Usage(completion_tokens=tokens)
    return TaskCompleted(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), finish_reason="stop", usage=usage)


def test_a_whole_task_has_no_problem() -> None:
    ev = Events()
    events = _task(ev, ev.chunk(index=0, text="a", tokens=2), ev.chunk(index=2, text="b"), _completed(ev, 3))
    assert _check(events, {"t1": "ab"}) == []


def test_a_lost_chunk_is_named() -> None:
    ev = Events()
    events = _task(ev, ev.chunk(index=0, text="a"), ev.chunk(index=2, text="c"), _completed(ev, 3))
    assert _check(events) == ["task t1: chunk at token 2 (seq 7) where token 1 was due"]


def test_a_chunk_after_the_end_and_a_short_client_are_named() -> None:
    ev = Events()
    events = _task(ev, ev.chunk(index=0, text="a"), _completed(ev, 2), ev.chunk(index=1, text="b"))
    problems = _check(events, {"t1": "x"})
    assert problems == [
        "task t1: chunk at token 1 (seq 8) came after the task ended",
        "task t1: completed with 2 tokens, its chunks hold 1",
        "task t1: the client received 'x', the log holds 'a'",
    ]


def test_a_failed_task_is_not_held_to_its_text() -> None:
    ev = Events()
    failed = TaskFailed(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), error="could not publish")
    assert _check(_task(ev, ev.chunk(index=5, text="a"), failed), {"t1": ""}) == []


def test_a_task_of_several_choices_is_checked_choice_by_choice() -> None:
    ev = Events()
    second = msgspec.structs.replace(ev.chunk(index=0, text="x", tokens=2), choice=1)
    third = msgspec.structs.replace(ev.chunk(index=0, text="y"), choice=1)  # choice 1's token 0 again
    ends = [ChoiceEnd(index=0, finish_reason="stop", completion_tokens=1)]
    ends.append(ChoiceEnd(index=1, finish_reason="length", completion_tokens=2))
    whole = msgspec.structs.replace(_completed(ev, 3), choices=ends)
    events = _task(ev, ev.chunk(index=0, text="a"), second, whole)
    assert _check(events, {"t1": "a"}) == []  # the folded and delivered text: choice 0's
    broken = _task(ev, ev.chunk(index=0, text="a"), second, third, msgspec.structs.replace(whole, choices=ends))
    assert _check(broken) == [
        "task t1: chunk at token 0 of choice 1 (seq 8) where token 2 was due",
        "task t1: completed with 3 tokens, its chunks hold 2",
        "task t1: choice 1 completed with 2 tokens, its chunks hold 1",
    ]
