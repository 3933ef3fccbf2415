"""A node that comes back: its worker's `NodeJoined` brings a timed-out or left node up again,
only from that node's worker, and old logs (without `cause`) still decode."""

from __future__ import annotations

import msgspec
import pytest

from events.apply import ForbiddenOrigin, apply
from events.catalogue import LogEvent, NodeJoined, NodeLeft, NodeTimedOut
from events.codec import decode_log_event
from events.fold import fold
from events.ids import NodeId
from events.state import State
from events.vocabulary import JoinCause
from tests.events.builders import Events


def _gone(ev: Events, how: str) -> LogEvent:
    if how == "timed_out":
        return NodeTimedOut(env=ev.master.stamp(), node_id=NodeId("n1"), last_seen=5)
    return NodeLeft(env=ev.worker("n1").stamp(), node_id=NodeId("n1"), reason="shutdown")


def _down(ev: Events, how: str) -> State:
    return fold([(1, ev.node("n1")), (2, _gone(ev, how))])


@pytest.mark.parametrize(("how", "cause"), [("timed_out", "timed_out"), ("left", "left"), ("timed_out", "reconnect")])
def test_a_node_gone_is_up_again_when_its_worker_rejoins(how: str, cause: JoinCause) -> None:
    ev = Events()
    down = _down(ev, how)
    n1 = NodeId("n1")
    assert down.nodes[n1].status == how
    rejoin = msgspec.structs.replace(ev.node("n1"), cause=cause)
    up = apply(down, 3, rejoin)
    assert (up.nodes[n1].status, up.nodes[n1].reason) == ("up", "")


def test_only_the_nodes_own_worker_brings_it_back() -> None:
    ev = Events()
    forged = msgspec.structs.replace(ev.node("n1"), env=ev.worker("n2").stamp(), cause="timed_out")
    with pytest.raises(ForbiddenOrigin):
        apply(_down(ev, "timed_out"), 3, forged)


def test_a_join_from_a_log_written_before_causes_is_a_start() -> None:
    joined = Events().node("n1")
    old = {key: value for key, value in msgspec.to_builtins(joined).items() if key != "cause"}
    assert old["type"] == "node_joined"
    decoded = decode_log_event(msgspec.msgpack.encode(old))
    assert isinstance(decoded, NodeJoined) and decoded.cause == "start" and decoded == joined
