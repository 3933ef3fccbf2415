"""Coalescing the runner's waiting chunks (pure): per task nothing changes but the number of events."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from events.catalogue import ChunkGenerated, LogEvent, TaskCompleted
from events.ids import TaskId
from events.logprobs import TokenLogprob
from runner.service.coalesce import MERGED_TOKENS_MAX, PendingEvents, merged_chunk
from tests.events.builders import Events

ev = Events()
TASKS = ["t1", "t2", "t3"]
WITH_LOGPROBS = {"t2"}  # one task asked for logprobs: its chunks carry one per token


def _chunk(task_id: str, index: int, tokens: int) -> ChunkGenerated:
    ids = [1000 * index + k for k in range(tokens)]
    logprobs = (
        [TokenLogprob(token_id=i, token=f"<{i}>", logprob=-0.5) for i in ids] if task_id in WITH_LOGPROBS else None
    )
    return ChunkGenerated(
        env=ev.task_rank(task_id).stamp(),
        task_id=TaskId(task_id),
        index=index,
        text="".join(f"<{i}>" for i in ids),
        token_ids=ids,
        logprobs=logprobs,
    )


def _completed(task_id: str) -> TaskCompleted:
    return TaskCompleted(env=ev.task_rank(task_id).stamp(), task_id=TaskId(task_id), finish_reason="stop")


def _trace(events: list[LogEvent], task_id: str | None) -> list[object]:
    """What a reader learns of one task (None: of the task-less events): its tokens one by one
    with their logprobs, and every other event by id with the text of the chunks since the last."""
    trace: list[object] = []
    text = ""
    for event in events:
        if getattr(event, "task_id", None) != task_id:
            continue
        if isinstance(event, ChunkGenerated):
            text += event.text
            logprobs: list[int | None] = [lp.token_id for lp in event.logprobs or []] or [None] * len(event.token_ids)
            trace += [("token", t, lp) for t, lp in zip(event.token_ids, logprobs, strict=True)]
        else:
            trace.append(("event", event.env.event_id, text))
            text = ""
    return [*trace, ("text", text)]


# A step: a task makes a chunk of 1-3 tokens, or completes (once), or the runner changes status
# (an event of no task), or the log takes the oldest waiting event (0) or up to N of them together
# (`pop_distinct`).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("chunk"), st.sampled_from(TASKS), st.integers(1, 3)),
        st.tuples(st.just("complete"), st.sampled_from(TASKS), st.just(0)),
        st.tuples(st.just("status"), st.just(""), st.just(0)),
        st.tuples(st.just("pop"), st.just(""), st.integers(0, 4)),
    ),
    max_size=60,
)


@given(steps)
def test_coalescing_keeps_each_tasks_events_text_tokens_and_order(script: list[tuple[str, str, int]]) -> None:
    pending = PendingEvents()
    pushed: list[LogEvent] = []
    popped: list[LogEvent] = []
    made = 0
    next_index = dict.fromkeys(TASKS, 0)
    ended: set[str] = set()
    for kind, task_id, tokens in script:
        if kind == "pop":
            together = [p for p in [pending.pop()] if p is not None] if tokens == 0 else pending.pop_distinct(tokens)
            _assert_sent_together_safely([p.event for p in together], max(1, tokens))
            popped += [p.event for p in together]
            made += sum(p.made for p in together)
            continue
        if task_id in ended:
            continue
        if kind == "chunk":
            event: LogEvent = _chunk(task_id, next_index[task_id], tokens)
            next_index[task_id] += tokens
        elif kind == "complete":
            event = _completed(task_id)
            ended.add(task_id)
        else:
            event = ev.runner(1, "running")
        pushed.append(event)
        pending.push(event)
    while (taken := pending.pop()) is not None:
        popped.append(taken.event)
        made += taken.made

    assert made == len(pushed)  # the backlog's count of the runner's events comes out whole
    for task_id in [*TASKS, None]:
        assert _trace(popped, task_id) == _trace(pushed, task_id)
    ids = [event.env.event_id for event in popped]
    assert len(set(ids)) == len(ids) and set(ids) <= {event.env.event_id for event in pushed}
    for event in popped:
        if isinstance(event, ChunkGenerated):
            assert len(event.token_ids) <= MERGED_TOKENS_MAX
            assert event.logprobs is None or len(event.logprobs) == len(event.token_ids)
    _assert_no_chunk_crosses_a_status_change(pushed, popped)


def _assert_sent_together_safely(together: list[LogEvent], limit: int) -> None:
    """At most `limit`, at most one per task, and an event of no task only alone: a refusal of one
    of them never leaves a later event of its task stored."""
    tasks = [getattr(event, "task_id", None) for event in together]
    assert len(together) <= limit
    assert None not in tasks or len(tasks) == 1
    assert len(set(tasks)) == len(tasks)


def _assert_no_chunk_crosses_a_status_change(pushed: list[LogEvent], popped: list[LogEvent]) -> None:
    """What the runner made before a task-less event reaches the log before it, and nothing after."""

    def before_each_barrier(events: list[LogEvent]) -> list[set[object]]:
        seen: set[object] = set()
        found: list[set[object]] = []
        for event in events:
            if getattr(event, "task_id", None) is None:
                found.append(set(seen))
            if isinstance(event, ChunkGenerated):
                seen.update((event.task_id, token) for token in event.token_ids)
            else:
                seen.add(event.env.event_id)
        return found

    assert before_each_barrier(popped) == before_each_barrier(pushed)


def test_a_popped_chunk_is_never_merged_into() -> None:
    """Once handed to the log it may be stored: a later chunk waits as a new event of its own."""
    pending = PendingEvents()
    first, second, third = _chunk("t1", 0, 1), _chunk("t1", 1, 1), _chunk("t1", 2, 1)
    pending.push(first)
    taken = pending.pop()
    assert taken is not None and taken.event is first
    assert not pending.push(second)
    assert pending.push(third)  # joins `second`, still waiting
    merged = pending.pop()
    assert merged is not None and merged.made == 2
    assert isinstance(merged.event, ChunkGenerated)
    assert merged.event.env == second.env and merged.event.token_ids == [*second.token_ids, *third.token_ids]


def test_chunks_that_must_stay_apart() -> None:
    one = _chunk("t1", 0, 2)
    assert merged_chunk(one, _chunk("t1", 3, 1)) is None  # a gap: not the next token
    assert merged_chunk(one, _chunk("t3", 2, 1)) is None  # another task
    with_logprobs = _chunk("t2", 2, 1)
    assert merged_chunk(one, msgspec.structs.replace(with_logprobs, task_id=TaskId("t1"))) is None  # logprobs on one
    big = _chunk("t1", 0, MERGED_TOKENS_MAX)
    assert merged_chunk(big, _chunk("t1", MERGED_TOKENS_MAX, 1)) is None  # too large for one message


def test_a_completion_never_overtakes_its_tasks_chunks() -> None:
    pending = PendingEvents()
    for event in [_chunk("t1", 0, 1), _completed("t1"), _chunk("t2", 0, 1), _chunk("t2", 1, 1)]:
        pending.push(event)
    out = [taken.event for taken in iter(pending.pop, None)]
    assert [type(event).__name__ for event in out] == ["ChunkGenerated", "TaskCompleted", "ChunkGenerated"]
    assert len(pending) == 0


def test_events_of_distinct_tasks_leave_together_up_to_the_next_of_a_task_taken() -> None:
    pending = PendingEvents()
    for event in [_chunk("t1", 0, 1), _chunk("t2", 0, 1), _completed("t3"), _completed("t1"), _chunk("t4", 0, 1)]:
        pending.push(event)
    first = [p.event for p in pending.pop_distinct(8)]
    assert [(type(e).__name__, getattr(e, "task_id", None)) for e in first] == [
        ("ChunkGenerated", "t1"),
        ("ChunkGenerated", "t2"),
        ("TaskCompleted", "t3"),
    ]
    pending.push(ev.runner(1, "running"))
    assert [getattr(p.event, "task_id", None) for p in pending.pop_distinct(8)] == ["t1", "t4"]
    assert [getattr(p.event, "task_id", None) for p in pending.pop_distinct(8)] == [None]  # alone
    assert pending.pop_distinct(8) == []
