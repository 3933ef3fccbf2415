"""Several subject families read by one consumer each come out in log order (`eventlog.families`):
what a worker folds now that a node may create only consumers filtered to one subject."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest

from eventlog.families import Entry, fold_families, follow_families, read_family, read_patiently
from eventlog.log import EventLog
from eventlog.publish import LogUnreachable
from eventlog.streams import LogSettings
from events.catalogue import InstanceRetired, LogEvent
from events.fold import fold
from events.ids import InstanceId
from events.state import State
from events.subjects import WORKER_FAMILIES
from services.nats import EmbeddedNats
from tests.events.builders import Events
from tests.freeze import freeze

pytestmark = pytest.mark.timeout(60)
NODES = WORKER_FAMILIES[0]


def interleaved(ev: Events, round_: int) -> list[LogEvent]:
    """Nodes, instances and tasks mixed, each instance placed on nodes joined just before it."""
    a, b = f"a{round_}", f"b{round_}"
    return [
        ev.node(a),
        ev.created(f"t{round_}"),
        ev.node(b),
        ev.placed(f"i{round_}", nodes=(a, b)),
        ev.assigned(f"t{round_}", f"i{round_}"),
        ev.runner(0, "ready", f"i{round_}"),  # not a worker's: its families leave statuses out
        ev.chunk(f"t{round_}"),
        InstanceRetired(env=ev.master.stamp(), instance_id=InstanceId(f"i{round_}"), reason="test"),
    ]


def of_families(events: list[LogEvent], first_seq: int = 1) -> list[tuple[int, str]]:
    return [
        (seq, type(event).__name__)
        for seq, event in enumerate(events, start=first_seq)
        if type(event).__name__ in ("NodeJoined", "InstancePlaced", "InstanceRetired")
    ]


async def test_a_fold_of_families_is_the_log_order_fold_of_their_events(event_log: EventLog) -> None:
    ev = Events()
    events = [*interleaved(ev, 0), *interleaved(ev, 1)]
    await event_log.append_many(events)
    state = await fold_families(event_log, WORKER_FAMILIES, State())
    whole = fold(enumerate(events, start=1))
    assert state.quarantined_count == 0 and state.last_seq == len(events)
    assert state.nodes == whole.nodes and set(state.instances) == set(whole.instances) and not state.tasks
    for instance_id, instance in state.instances.items():
        assert instance.retired and whole.instances[instance_id].retired


async def test_following_families_hands_their_events_on_in_log_order(event_log: EventLog) -> None:
    """Appended while followed, in bursts: an instance placed on nodes that joined just before must
    never come out before them, whichever consumer delivers first."""
    ev = Events()
    got: list[tuple[int, str]] = []
    expected: list[tuple[int, str]] = []
    done = asyncio.Event()

    async def handle(entry: Entry) -> None:
        got.append((entry[0], type(entry[1]).__name__))
        if len(got) >= len(expected) > 0:
            done.set()

    following = asyncio.create_task(follow_families(event_log, 1, WORKER_FAMILIES, handle))
    try:
        appended: list[LogEvent] = []
        for round_ in range(5):
            burst = interleaved(ev, round_)
            await event_log.append_many(burst)
            appended += burst
        expected[:] = of_families(appended)
        if len(got) >= len(expected):
            done.set()
        await asyncio.wait_for(done.wait(), 30)
    finally:
        following.cancel()
    assert got == expected


def test_a_catch_up_read_waits_out_an_outage_longer_than_the_retry_time(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    """A bounded read gives up after the log's retry time (`LogUnreachable`); the live follower's
    catch-up reads wait the outage out instead: with a NATS majority cut off for longer, a worker
    otherwise went down mid-run (tests/netns/test_chaos.py)."""
    server = make_nats("outage").start()
    pid = server.pid
    assert pid is not None

    async def run() -> list[Entry]:
        log = await EventLog.connect(server.url, LogSettings(retry_seconds=0.5))
        try:
            ev = Events()
            await log.append_many([ev.node("a"), ev.node("b")])
            freeze(pid)
            try:
                with pytest.raises(LogUnreachable):
                    await read_family(log, NODES, 1, 2)
                patient = asyncio.create_task(read_patiently(log, NODES, 1, 2))
                await asyncio.sleep(1.5)  # the outage outlasts the retry time
            finally:
                os.kill(pid, signal.SIGCONT)
            return await asyncio.wait_for(patient, 30)
        finally:
            await log.close()

    assert [seq for seq, _event, _subject in asyncio.run(run())] == [1, 2]
