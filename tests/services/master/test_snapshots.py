"""The master's snapshot schedule (pure) and its writer on a real nats-server."""

from __future__ import annotations

import nats
import pytest

from eventlog.log import EventLog
from eventlog.snapshots import read_snapshot
from events.catalogue import ChunkGenerated, LogEvent
from events.fold import apply_live, fold
from events.state import State
from events.synthetic import synthetic_history
from services.master.snapshots import SnapshotWriter, snapshot_due


@pytest.mark.parametrize(
    ("last_seq", "written_seq", "every", "due"),
    [
        (0, 0, 100, False),
        (99, 0, 100, False),
        (100, 0, 100, True),
        (250, 200, 100, False),
        (300, 200, 100, True),
        (10**6, 0, 0, False),  # 0: never
    ],
)
def test_a_snapshot_is_due_every_so_many_events(last_seq: int, written_seq: int, every: int, due: bool) -> None:
    assert snapshot_due(State(last_seq=last_seq), written_seq, every) is due


def _without_chunks(events: list[LogEvent], upto: int) -> State:
    """What the master's live fold holds after `upto` events: it never receives a chunk."""
    state = State()
    for seq, event in enumerate(events[:upto], start=1):
        if not isinstance(event, ChunkGenerated):
            state, _ = apply_live(state, seq, event)
    return state


@pytest.mark.timeout(60)
async def test_the_writer_stores_the_whole_fold_when_due_and_only_then(event_log: EventLog, nats_url: str) -> None:
    """The master's live State lacks the chunks; the snapshot every service starts from must not."""
    events = synthetic_history(1000)
    await event_log.append_many(events)
    writer = SnapshotWriter(event_log, every_events=400, complete=State())
    assert not await writer.write_if_due(_without_chunks(events, 300))
    live = _without_chunks(events, 1000)
    state = fold(enumerate(events, start=1))
    assert live != state  # the test means something only if chunks were left out
    assert await writer.write_if_due(live) and writer.written_seq == 1000
    assert not await writer.write_if_due(live)  # nothing new since
    nc = await nats.connect(nats_url)  # pyright: ignore[reportUnknownMemberType]
    try:
        stored = await read_snapshot(nc.jetstream())  # pyright: ignore[reportUnknownMemberType]
    finally:
        await nc.close()
    assert stored is not None and stored.state == state


@pytest.mark.timeout(60)
async def test_a_stand_by_folds_on_but_stores_nothing(event_log: EventLog, nats_url: str) -> None:
    events = synthetic_history(500)
    await event_log.append_many(events)
    writer = SnapshotWriter(event_log, every_events=400, complete=State())
    assert not await writer.write_if_due(_without_chunks(events, 500), store=False)
    assert writer.complete == fold(enumerate(events, start=1)) and writer.written_seq == 500
    nc = await nats.connect(nats_url)  # pyright: ignore[reportUnknownMemberType]
    try:
        assert await read_snapshot(nc.jetstream()) is None  # pyright: ignore[reportUnknownMemberType]
    finally:
        await nc.close()
