"""Snapshots of the State in a real nats-server's object store, and start-ups from them: a snapshot
plus the tail equals the full fold, a trimmed log starts, an unusable snapshot is ignored."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.js import JetStreamContext

from eventlog.log import EventLog
from eventlog.snapshots import read_snapshot
from events.fold import Folder, fold
from events.state import State, canonical_bytes
from events.subjects import EVENTS_STREAM, SNAPSHOT_BUCKET
from events.synthetic import synthetic_history

EVENTS = synthetic_history(6000)  # ~130 tasks
KEPT = 10


@pytest.fixture
async def js(nats_url: str) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_url)  # pyright: ignore[reportUnknownMemberType]
    try:
        yield nc.jetstream()  # pyright: ignore[reportUnknownMemberType]
    finally:
        await nc.close()


def full_fold(count: int, kept: int = KEPT) -> State:
    return fold(zip(range(1, count + 1), EVENTS[:count], strict=True), State.keeping(kept))


@pytest.mark.timeout(60)
async def test_a_start_up_from_the_snapshot_plus_the_tail_equals_the_full_fold(
    event_log: EventLog, js: JetStreamContext
) -> None:
    assert await read_snapshot(js) is None  # none written yet: a full fold
    await event_log.append_many(EVENTS[:4000])
    written = await event_log.fold(finished_tasks_kept=KEPT)
    assert await event_log.write_snapshot(written) == 4000
    await event_log.append_many(EVENTS[4000:])

    snapshot = await read_snapshot(js)
    assert snapshot is not None and snapshot.state == written
    started = await event_log.fold(from_snapshot=True, finished_tasks_kept=KEPT)
    assert canonical_bytes(started) == canonical_bytes(full_fold(6000))
    assert len([t for t in started.tasks.values() if t.ended]) == KEPT


@pytest.mark.timeout(60)
async def test_a_log_trimmed_by_retention_starts_with_or_without_a_snapshot(
    event_log: EventLog, js: JetStreamContext
) -> None:
    await event_log.append_many(EVENTS[:3000])
    await event_log.write_snapshot(await event_log.fold(finished_tasks_kept=KEPT))
    await event_log.append_many(EVENTS[3000:])
    await js.purge_stream(EVENTS_STREAM, seq=3500)  # the head up to seq 3499 is gone
    assert (await js.stream_info(EVENTS_STREAM)).state.first_seq == 3500

    from_snapshot = await event_log.fold(from_snapshot=True, finished_tasks_kept=KEPT)
    assert from_snapshot.last_seq == 6000  # seqs 3001..3499 stepped over, as deleted messages
    without = await event_log.fold(finished_tasks_kept=KEPT)
    assert without.last_seq == 6000  # from the first stored seq, never a SequenceGap
    # Without a snapshot the trimmed head's NodeJoined and InstancePlaced are gone: the tail's
    # runner events are quarantined (the service starts, but knows less); the snapshot knows them.
    assert len(without.nodes) == 0 and without.quarantined_count > 0
    expected = Folder(full_fold(3000))  # what survives: the snapshot, then the stored tail
    expected.skip_to(3500)
    expected.add_all(zip(range(3500, 6001), EVENTS[3499:], strict=True))
    assert canonical_bytes(from_snapshot) == canonical_bytes(expected.state)
    assert from_snapshot.nodes == full_fold(6000).nodes


@pytest.mark.timeout(60)
async def test_an_unusable_snapshot_is_ignored_and_the_log_folded(event_log: EventLog, js: JetStreamContext) -> None:
    await event_log.append_many(EVENTS[:2000])
    store = await js.object_store(SNAPSHOT_BUCKET)
    await store.put("state", b"\x93not a snapshot")
    assert await read_snapshot(js) is None
    assert await event_log.fold(from_snapshot=True, finished_tasks_kept=KEPT) == full_fold(2000)

    # A snapshot of an earlier incarnation of the stream (deleted and recreated: seqs restart).
    await event_log.write_snapshot(full_fold(2000))
    await event_log.reset_stream("events")
    await event_log.append_many(EVENTS[:500])
    assert await read_snapshot(js) is None
    assert await event_log.fold(from_snapshot=True, finished_tasks_kept=KEPT) == full_fold(500)
