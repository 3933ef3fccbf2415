"""The worker's rule for announcing its node again (`services.worker.plan.rejoin_cause`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from events.catalogue import LogEvent, NodeLeft, NodeTimedOut
from events.fold import apply_live
from events.ids import NodeId
from events.state import State
from events.vocabulary import JoinCause
from services.worker.plan import rejoin_cause
from tests.events.builders import Events

ME = NodeId("n1")

Case = Callable[[Events], LogEvent]


def _timed_out(node: str) -> Case:
    return lambda ev: NodeTimedOut(env=ev.master.stamp(), node_id=NodeId(node), last_seen=1)


def _left(node: str) -> Case:
    return lambda ev: NodeLeft(env=ev.worker(node).stamp(), node_id=NodeId(node), reason="shutdown")


def _forged_timeout(ev: Events) -> LogEvent:
    """A timeout published by a worker: quarantined by the fold, so the node stays up."""
    return NodeTimedOut(env=ev.worker("n2").stamp(), node_id=ME, last_seen=1)


CASES: list[tuple[str, Case, JoinCause | None]] = [
    ("my node timed out", _timed_out("n1"), "timed_out"),
    ("my node left (a stale incarnation)", _left("n1"), "left"),
    ("another node timed out", _timed_out("n2"), None),
    ("another node left", _left("n2"), None),
    ("a forged timeout the fold refused", _forged_timeout, None),
    ("a task event", lambda ev: ev.created("t1"), None),
]


@pytest.mark.parametrize(("name", "make", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rejoin_cause(name: str, make: Case, expected: JoinCause | None) -> None:
    ev = Events()
    state = State()
    for event in (ev.node("n1"), ev.node("n2")):
        state, _ = apply_live(state, state.last_seq + 1, event)
    event = make(ev)
    state, _ = apply_live(state, state.last_seq + 1, event)
    assert rejoin_cause(state, ME, event) == expected
