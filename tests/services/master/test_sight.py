"""A master's blindness is never a node's silence: table tests of `services.master.sight` and of
the node timeout as the master judges it through its hearing (probes read back each tick)."""

from __future__ import annotations

import msgspec
import pytest

from events.catalogue import MasterProbe, NodeTimedOut
from services.master.core import MasterPolicy
from services.master.hearing import Hearing
from services.master.sight import PROMPT_SECONDS, Sight
from services.master.watchdog import NS, tick
from tests.events.builders import fake_stamper
from tests.services.master.test_core import Cluster
from tests.services.master.test_liveness import MASTER, Node

TIMEOUT_S = 10
INTERVAL_S = 1.0  # the test's tick and probe interval


class Second(msgspec.Struct, frozen=True, kw_only=True):
    """What happens in one second of a timeline: whether the node's beat reaches the master, and
    after how long the master's probe comes back (None: it does not)."""

    beat: bool = True
    probe_delay: float | None = 0.01


ALIVE, DEAD = Second(), Second(beat=False)
BLIND = Second(beat=False, probe_delay=None)  # the master's reading stalled: it hears nothing
LATE = Second(beat=False, probe_delay=2 * PROMPT_SECONDS)  # probes come back, but late


def timeline(*parts: tuple[int, Second]) -> list[Second]:
    return [second for count, second in parts for _ in range(count)]


def run(seconds: list[Second]) -> list[int]:
    """The seconds (from the node's join) at which the master timed the node out."""
    c = Cluster(MasterPolicy(node_timeout_seconds=TIMEOUT_S))
    node, hearing = Node(c, "n1", 0.0), Hearing(MASTER, INTERVAL_S)
    c.feed(node.joined())
    hearing.notice(c.state, c.clock.now_ns)
    out: list[int] = []
    for at, second in enumerate(seconds, start=1):
        c.clock.advance(1)
        if second.beat:
            hearing.heard(node.beat(), c.clock.now_ns)
        if second.probe_delay is not None:
            sent = MasterProbe(env=fake_stamper("master", c.clock).stamp(), master=MASTER)
            hearing.heard(sent, c.clock.now_ns + int(second.probe_delay * NS))
        hearing.notice(c.state, c.clock.now_ns)
        decided = tick(c.state, c.clock.now_ns, hearing.liveness(), c.policy, fake_stamper("master", c.clock))
        if timed_out := [e for e in decided if isinstance(e, NodeTimedOut)]:
            c.feed(*timed_out)
            out.append(at)
    return out


# (name, timeline, when the node must be timed out: [] for never)
CASES = [
    ("alive, the master sees", timeline((60, ALIVE)), []),
    ("dead from the start, the master sees", timeline((30, DEAD)), [TIMEOUT_S + 1]),
    ("the master blind 30 s while the node beats on", timeline((5, ALIVE), (30, BLIND), (30, ALIVE)), []),
    (
        "the master blind 30 s, the node's beats of that time lost, its next one 3 s after sight returns",
        timeline((5, ALIVE), (30, BLIND), (3, DEAD), (30, ALIVE)),
        [],
    ),
    ("probes read back late 20 s: they prove nothing", timeline((5, ALIVE), (20, LATE), (20, ALIVE)), []),
    ("blind from the start: nothing proven, nobody judged", timeline((60, BLIND)), []),
    # Heard last at 5, proven points at 1..8, then none until 39: 3 seen seconds before the
    # blindness, and the timeout is passed 8 seen seconds after it (3 + 8 > 10).
    (
        "a dead node's silence counts only while the master sees",
        timeline((5, ALIVE), (3, DEAD), (30, BLIND), (20, DEAD)),
        [47],
    ),
]


@pytest.mark.parametrize(("timeline_", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_node_is_timed_out_for_its_silence_never_for_the_masters_blindness(
    timeline_: list[Second], expected: list[int]
) -> None:
    assert run(timeline_) == expected


def test_a_dead_node_times_out_within_the_timeout_plus_a_bounded_extra_however_sight_flickers() -> None:
    """Probes every second, every third one lost: the node dead from the start is still timed out
    by the timeout plus one probe interval and the prompt bound."""
    flicker = [DEAD if n % 3 else BLIND for n in range(1, 40)]
    (at,) = run(flicker)
    assert TIMEOUT_S < at <= TIMEOUT_S + INTERVAL_S + PROMPT_SECONDS + 1


S = NS


@pytest.mark.parametrize(
    ("probes", "heard", "silence"),
    [
        ([], 0, 0),  # nothing proven yet
        ([(10, 10)], 0, 10 * S),
        ([(10, 10)], 12, 0),  # heard after the newest proven point
        ([(10, 10), (11, 11), (40, 40)], 0, 11 * S),  # 11..40 blind
        ([(10, 10), (11, 11), (40, 40), (41, 41)], 20, 1 * S),  # heard while blind: 40..41 counts
        ([(10, 10), (11, 14)], 0, 10 * S),  # late: proves nothing
        ([(10, 10), (9, 9)], 0, 10 * S),  # out of order: nothing newer
    ],
)
def test_silence_is_seen_time_from_the_last_heard_to_the_newest_proven_point(
    probes: list[tuple[int, int]], heard: int, silence: int
) -> None:
    sight = Sight(probe_interval_seconds=1.0)
    for sent, received in probes:
        sight.probe_returned(sent * S, received * S)
    assert sight.silence(heard * S) == silence
