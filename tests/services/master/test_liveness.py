"""Liveness by the master's own clock, and nodes that come back: table tests of the hearing, the
watchdog's node rule, the culprit's silence rule as the master feeds it, and the core's re-placement."""

from __future__ import annotations

from typing import TypeVar

import msgspec
import pytest

from events.catalogue import (
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    MasterProbe,
    NodeHeartbeat,
    NodeJoined,
    NodeTimedOut,
    Origin,
    RunnerHeartbeat,
    TaskStalled,
)
from events.ids import InstanceId, NodeId, TaskId
from events.stamp import Stamper
from events.vocabulary import JoinCause
from services.master.core import MasterPolicy
from services.master.hearing import Hearing, as_heard
from services.master.watchdog import NS, Liveness, blame, tick
from tests.events.builders import fake_stamper
from tests.services.master.test_core import Cluster, _failed  # pyright: ignore[reportPrivateUsage]

# Sender clocks that run an hour or half a minute slow, right, or fast of the master's.
SKEWS_S = [-3600.0, -30.0, 0.0, 30.0, 3600.0]
TIMEOUT_S = 10.0
MASTER = "m1"


class Node:
    """A worker whose clock is `skew_s` off the cluster's: it announces and beats."""

    def __init__(self, c: Cluster, node_id: str, skew_s: float) -> None:
        self.c = c
        self.node_id = NodeId(node_id)
        skew = int(skew_s * NS)
        self.stamper = Stamper(Origin(service="worker", node=node_id), wall_ns=lambda: c.clock.now_ns + skew)

    def joined(self, cause: JoinCause = "start") -> NodeJoined:
        env = self.stamper.stamp()
        return NodeJoined(
            env=env,
            node_id=self.node_id,
            host="127.0.0.1",
            cores=2,
            memory_bytes=2**34,
            backend="cpu",
            version="t",
            cause=cause,
        )

    def beat(self) -> NodeHeartbeat:
        return NodeHeartbeat(env=self.stamper.stamp(), node_id=self.node_id)


def timeouts(events: list[LogEvent]) -> list[NodeTimedOut]:
    return [e for e in events if isinstance(e, NodeTimedOut)]


def probe(c: Cluster, hearing: Hearing, delay_s: float = 0.0) -> None:
    """The master's probe of this tick, read back after `delay_s` (its sight)."""
    sent = MasterProbe(env=fake_stamper("master", c.clock).stamp(), master=MASTER)
    hearing.heard(sent, c.clock.now_ns + int(delay_s * NS))


def master_tick(c: Cluster, hearing: Hearing) -> list[LogEvent]:
    """What the master shell does each tick, its sight good: probe, notice nodes newly up, then
    run the watchdog."""
    probe(c, hearing)
    hearing.notice(c.state, c.clock.now_ns)
    return tick(c.state, c.clock.now_ns, hearing.liveness(), c.policy, fake_stamper("master", c.clock))


def live_for(c: Cluster, hearing: Hearing, seconds: int, node: Node | None) -> list[LogEvent]:
    """Tick once a second for `seconds`; `node` beats before each tick (None: silence)."""
    out: list[LogEvent] = []
    for _ in range(seconds):
        c.clock.advance(1)
        if node is not None:
            hearing.heard(node.beat(), c.clock.now_ns)
        out += master_tick(c, hearing)
    return out


@pytest.mark.parametrize("skew_s", SKEWS_S)
def test_a_node_that_beats_is_never_timed_out_whatever_its_clock(skew_s: float) -> None:
    c = Cluster(MasterPolicy(node_timeout_seconds=TIMEOUT_S))
    node, hearing = Node(c, "n1", skew_s), Hearing(MASTER, 1.0)
    c.feed(node.joined())
    assert timeouts(live_for(c, hearing, 60, node)) == []
    last_heard = c.clock.now_ns
    assert timeouts(live_for(c, hearing, int(TIMEOUT_S), None)) == []  # silent for exactly the timeout
    out = timeouts(live_for(c, hearing, 1, None))
    assert [(e.node_id, e.last_seen) for e in out] == [("n1", last_heard)]  # on the master's clock


@pytest.mark.parametrize("skew_s", SKEWS_S)
def test_a_node_that_never_beats_gets_a_full_timeout_from_when_the_master_noticed_it(skew_s: float) -> None:
    c = Cluster(MasterPolicy(node_timeout_seconds=TIMEOUT_S))
    node, hearing = Node(c, "n1", skew_s), Hearing(MASTER, 1.0)
    c.feed(node.joined())
    assert master_tick(c, hearing) == []  # noticed now, whatever its join's stamp says
    assert timeouts(live_for(c, hearing, int(TIMEOUT_S), None)) == []
    assert [e.node_id for e in timeouts(live_for(c, hearing, 1, None))] == ["n1"]


def test_two_masters_time_out_one_announcement_with_one_id() -> None:
    """Masters that noticed the node at different times decide one timeout: its id names the
    announcement, not the moment (a double leader stores it once)."""
    c = Cluster(MasterPolicy(node_timeout_seconds=TIMEOUT_S))
    c.feed(Node(c, "n1", 0).joined())
    early, late = Hearing(MASTER, 1.0), Hearing(MASTER, 1.0)
    early.notice(c.state, c.clock.now_ns)
    late.notice(c.state, c.clock.now_ns + 3 * NS)
    c.clock.advance(20)
    probe(c, early)
    probe(c, late)
    stamper = fake_stamper("master", c.clock)
    ids = [tick(c.state, c.clock.now_ns, h.liveness(), c.policy, stamper)[0].env.event_id for h in (early, late)]
    assert ids[0] == ids[1]


@pytest.mark.parametrize("cause", ["timed_out", "reconnect"])
def test_a_timed_out_node_that_rejoins_is_up_the_default_model_is_placed_again(cause: JoinCause) -> None:
    c = Cluster(MasterPolicy(node_timeout_seconds=TIMEOUT_S, models=("tiny",)))
    node, hearing = Node(c, "n1", -3600.0), Hearing(MASTER, 1.0)
    placed = c.feed(node.joined())
    assert [type(e) for e in placed] == [InstancePlaced] and master_tick(c, hearing) == []
    out = live_for(c, hearing, int(TIMEOUT_S) + 1, None)  # a pause longer than the timeout
    assert [type(e) for e in out] == [NodeTimedOut]
    retired = c.feed(*out)
    assert [type(e) for e in retired] == [InstanceRetired] and c.state.nodes[node.node_id].status == "timed_out"
    assert master_tick(c, hearing) == []  # a node timed out is not timed out again

    replaced = c.feed(node.joined(cause))  # the worker, alive again, says so
    assert c.state.nodes[node.node_id].status == "up" and c.state.nodes[node.node_id].reason == ""
    assert [type(e) for e in replaced] == [InstancePlaced]
    assert master_tick(c, hearing) == []  # noticed anew: the stale last heartbeat does not count
    assert timeouts(live_for(c, hearing, 30, node)) == []


Stamped = TypeVar("Stamped", RunnerHeartbeat, LogEvent)


def _skewed(event: Stamped, skew_s: float) -> Stamped:
    """`event` as a sender whose clock is `skew_s` off would have stamped it."""
    return msgspec.structs.replace(
        event, env=msgspec.structs.replace(event.env, wall_time=event.env.wall_time + int(skew_s * NS))
    )


@pytest.mark.parametrize("skew_s", [-3600.0, -60.0])
def test_a_rank_whose_clock_runs_slow_is_not_blamed_as_silent(skew_s: float) -> None:
    """The culprit's silence rule reads heartbeats as the master heard them: a rank that beats
    with a slow clock is alive. (Read by the sender's stamp, the same beats say "silent".)"""
    c = Cluster(MasterPolicy(node_timeout_seconds=TIMEOUT_S))
    instance_id = c.ready_instance()
    c.feed(
        c.ev.started("warm", 0), c.ev.progress("warm", rank=0, iteration=0), c.ev.progress("warm", rank=1, iteration=0)
    )
    c.clock.advance(31)
    beats = [
        c.ev.heartbeat(instance_id, 0, "prefill", "warm"),
        _skewed(c.ev.heartbeat(instance_id, 1, "prefill", "warm"), skew_s),
    ]
    hearing = Hearing(MASTER, 1.0)
    for beat in beats:
        hearing.heard(beat, c.clock.now_ns)
    instance, task = c.state.instances[InstanceId(instance_id)], c.state.tasks[TaskId("warm")]
    assert blame(c.state, instance, task, hearing.liveness(), c.clock.now_ns).cause != "silent"
    as_sent = Liveness(runners={(b.instance_id, b.rank): b for b in beats})
    assert blame(c.state, instance, task, as_sent, c.clock.now_ns).cause == "silent"


def test_a_heartbeat_as_heard_keeps_everything_but_its_stamp() -> None:
    c = Cluster()
    beat = c.ev.heartbeat("i1", 0, "decode", "t1")
    heard = as_heard(beat, 42)
    assert heard.env.wall_time == 42
    assert msgspec.structs.replace(heard, env=beat.env) == beat


def test_a_task_whose_ranks_clocks_run_slow_is_not_stalled_while_it_progresses() -> None:
    """Progress stamped an hour old still is progress: the master saw it arrive. Judged by the
    stamps, the task would be stalled within the deadline; judged by arrival, only once the
    progress stops."""
    c = Cluster(MasterPolicy(task_stall_seconds=30.0, node_timeout_seconds=TIMEOUT_S))
    c.ready_instance()
    hearing = Hearing(MASTER, 1.0)
    for iteration in range(60):
        c.clock.advance(1)
        c.feed(_skewed(c.ev.progress("warm", rank=1, iteration=iteration), -3600.0))
        hearing.heard(Node(c, "n1", 0).beat(), c.clock.now_ns)
        hearing.heard(Node(c, "n2", 0).beat(), c.clock.now_ns)
        assert master_tick(c, hearing) == []
    by_stamps = tick(c.state, c.clock.now_ns, Liveness(), c.policy, fake_stamper("master", c.clock))
    assert any(isinstance(e, TaskStalled) for e in by_stamps)
    stalled: list[LogEvent] = []
    for _ in range(31):  # the progress stops; the master ticks on, seeing (its probes come back)
        c.clock.advance(1)
        stalled += [e for e in master_tick(c, hearing) if isinstance(e, TaskStalled)]
    assert stalled


def test_a_decoding_task_shows_its_progress_by_its_ranks_steps_not_its_chunks() -> None:
    """The master folds no chunks: a long decode stays alive while its ranks' heartbeats step on,
    and is stalled once the steps stop, though the frozen rank's recorder keeps beating."""
    c = Cluster(MasterPolicy(task_stall_seconds=30.0, node_timeout_seconds=TIMEOUT_S))
    instance_id = c.ready_instance()
    c.feed(*(c.ev.started("warm", rank) for rank in (0, 1)))
    hearing = Hearing(MASTER, 1.0)

    def beat_at(step: int) -> list[LogEvent]:
        c.clock.advance(1)
        for n in ("n1", "n2"):
            hearing.heard(Node(c, n, 0).beat(), c.clock.now_ns)
        for rank in (0, 1):
            hearing.heard(c.ev.heartbeat(instance_id, rank, "decode", "warm", iteration=step), c.clock.now_ns)
        return master_tick(c, hearing)

    assert all(beat_at(step) == [] for step in range(1, 61))  # a minute of decode, no event folded
    stalled = [e for step in range(31) for e in beat_at(60) if isinstance(e, TaskStalled)]
    assert len(stalled) == 1 and "decoding: step 60" in stalled[0].diagnosis


@pytest.mark.parametrize(
    ("blind_s", "frozen_after", "stalled_at"),
    [
        (40, None, None),  # blind longer than the stall bound while the ranks step on: never stalled
        # Frozen from the start: the master first sees the ranks' steps when it hears again (41,
        # or 1 when it always could), and stalls the task once more than 30 seen seconds passed.
        (40, 0, 41 + 31),
        (0, 0, 1 + 31),
    ],
)
def test_a_decoding_task_is_stalled_for_its_ranks_silence_never_for_the_masters_blindness(
    blind_s: int, frozen_after: int | None, stalled_at: int | None
) -> None:
    """The master's reading of the heartbeats stalls (its consumer was on a NATS server that died):
    it hears no step and no probe of its own. That time is not counted against the task; once
    sight returns, a task whose ranks moved on is not stalled, and one whose ranks froze is, after
    the bound of seen time."""
    c = Cluster(MasterPolicy(task_stall_seconds=30.0, node_timeout_seconds=TIMEOUT_S))
    instance_id = c.ready_instance()
    c.feed(*(c.ev.started("warm", rank) for rank in (0, 1)))
    hearing = Hearing(MASTER, 1.0)
    stalled: list[int] = []
    step = 0
    for second in range(1, 121):
        c.clock.advance(1)
        step += frozen_after is None or second <= frozen_after
        if second > blind_s:  # the master hears again: beats and its own probes
            for n in ("n1", "n2"):
                hearing.heard(Node(c, n, 0).beat(), c.clock.now_ns)
            for rank in (0, 1):
                hearing.heard(c.ev.heartbeat(instance_id, rank, "decode", "warm", iteration=step), c.clock.now_ns)
            probe(c, hearing)
        hearing.notice(c.state, c.clock.now_ns)
        decided = tick(c.state, c.clock.now_ns, hearing.liveness(), c.policy, fake_stamper("master", c.clock))
        if any(isinstance(e, TaskStalled) for e in decided):
            stalled.append(second)
            break
    assert stalled == ([] if stalled_at is None else [stalled_at])


def test_a_casualty_whose_clock_runs_fast_is_retired_after_the_grace() -> None:
    """A rank that lost its peers, stamped an hour ahead: the grace runs from its arrival."""
    c = Cluster(MasterPolicy(peer_loss_grace_seconds=2.0, node_timeout_seconds=TIMEOUT_S))
    instance = c.ready_instance()
    hearing = Hearing(MASTER, 1.0)
    assert c.feed(_skewed(_failed(c, instance, 0, "the ring group broke", "peer_lost"), 3600.0)) == []
    assert master_tick(c, hearing) == []
    c.clock.advance(3)
    assert [e for e in master_tick(c, hearing) if isinstance(e, InstanceRetired)]
    assert tick(c.state, c.clock.now_ns, Liveness(), c.policy, fake_stamper("master", c.clock)) == []  # by stamps
