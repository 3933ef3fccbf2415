"""The masters hand a task's request only to a node that serves it (`services.master.handover`)."""

from __future__ import annotations

import asyncio

import pytest

from events.catalogue import LogEvent, TaskCompleted, TaskCreated
from events.fold import fold
from events.handover import HandedOver, HandOverAsk, HandOverRefused, encode_handover, handover_subject
from events.ids import NodeId, TaskId
from events.state import State
from services.master.handover import FoldProgress, HandOverDesk, handover_refusal
from tests.events.builders import Events


def history() -> tuple[list[LogEvent], State]:
    """t1 on i1 (node-a rank 0, node-b rank 1), t2 on i2 (node-b), t3 waiting, t4 ended."""
    ev = Events()
    events: list[LogEvent] = [
        ev.node("node-a"),
        ev.node("node-b"),
        ev.placed("i1", nodes=("node-a", "node-b")),
        ev.placed("i2", nodes=("node-b",)),
        ev.created("t1"),
        ev.assigned("t1", "i1"),
        ev.created("t2"),
        ev.assigned("t2", "i2"),
        ev.created("t3"),
        ev.created("t4"),
        ev.assigned("t4", "i1"),
    ]
    events.append(TaskCompleted(env=ev.task_rank("t4", 1).stamp(), task_id=TaskId("t4"), finish_reason="stop"))
    state = fold(enumerate(events, start=1))
    return events, state


EVENTS, STATE = history()

CASES = [
    ("node-a", "t1", None),
    ("node-b", "t1", None),
    ("node-b", "t2", None),
    ("node-a", "t2", "instance i2, which has no rank on node node-a"),
    ("node-c", "t1", "no rank on node node-c"),
    ("node-a", "t3", "is not assigned to an instance"),
    ("node-a", "nope", "is not in the master's State"),
]


@pytest.mark.parametrize(("node", "task", "refused"), CASES)
def test_a_request_goes_only_to_a_node_with_a_rank_of_the_tasks_instance(
    node: str, task: str, refused: str | None
) -> None:
    said = handover_refusal(STATE, NodeId(node), TaskId(task))
    assert (said is None) if refused is None else (said is not None and refused in said), said


def test_an_ended_task_is_not_handed_over() -> None:
    assert STATE.tasks[TaskId("t4")].ended and STATE.quarantined_count == 0
    assert "has ended (completed)" in (handover_refusal(STATE, NodeId("node-a"), TaskId("t4")) or "")


def _desk(state: State, progress: FoldProgress, wait: float = 1.0) -> HandOverDesk:
    async def read(seq: int) -> object:
        return EVENTS[seq - 1]

    return HandOverDesk(lambda: state, progress, read, wait_seconds=wait)


def _ask(task: str, seq: int) -> bytes:
    return encode_handover(HandOverAsk(task_id=TaskId(task), assigned_seq=seq))


async def test_the_desk_hands_the_tasks_created_as_the_log_stores_it() -> None:
    progress = FoldProgress()
    progress.advanced(STATE.last_seq)
    answer = await _desk(STATE, progress).answer(handover_subject("node-a", "t1"), _ask("t1", 6))
    assert isinstance(answer, HandedOver) and answer.created == EVENTS[4] and isinstance(EVENTS[4], TaskCreated)
    refused = await _desk(STATE, progress).answer(handover_subject("node-a", "t2"), _ask("t2", 8))
    assert isinstance(refused, HandOverRefused) and "no rank on node node-a" in refused.error
    # an ask whose body names another task than its subject (the server checked the subject only)
    mixed = await _desk(STATE, progress).answer(handover_subject("node-a", "t1"), _ask("t2", 8))
    assert isinstance(mixed, HandOverRefused) and "came on" in mixed.error
    garbage = await _desk(STATE, progress).answer(handover_subject("node-a", "t1"), b"\xc1")
    assert isinstance(garbage, HandOverRefused) and "malformed" in garbage.error


async def test_an_ask_ahead_of_the_fold_waits_for_it() -> None:
    """The rank read TaskAssigned as the master did: the answer waits until the master folded it."""
    before = fold(enumerate(EVENTS[:5], start=1))  # t1 created, not assigned yet
    current = {"state": before}
    progress = FoldProgress()
    progress.advanced(before.last_seq)
    desk = HandOverDesk(lambda: current["state"], progress, lambda seq: asyncio.sleep(0, EVENTS[seq - 1]))
    answering = asyncio.create_task(desk.answer(handover_subject("node-a", "t1"), _ask("t1", 6)))
    await asyncio.sleep(0.05)
    assert not answering.done()
    current["state"] = STATE
    progress.advanced(STATE.last_seq)
    assert isinstance(await asyncio.wait_for(answering, 5), HandedOver)


async def test_an_ask_the_fold_never_reaches_is_refused_in_time() -> None:
    progress = FoldProgress()
    progress.advanced(3)
    answer = await _desk(STATE, progress, wait=0.05).answer(handover_subject("node-a", "t1"), _ask("t1", 6))
    assert isinstance(answer, HandOverRefused) and "did not reach seq 6" in answer.error
