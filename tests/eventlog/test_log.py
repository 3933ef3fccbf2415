"""The JetStream log adapter against a real nats-server (the session's, streams reset per test)."""

from __future__ import annotations

import asyncio
import secrets
from contextlib import aclosing
from datetime import UTC, datetime

import msgspec
import nats
import pytest

from eventlog.log import EventLog, LogError
from eventlog.streams import LogSettings, StreamLimits
from events.catalogue import ChunkGenerated, NodeHeartbeat, Origin, RunnerHeartbeat
from events.codec import encode
from events.fold import fold
from events.ids import InstanceId, NodeId, TaskId
from events.stamp import Stamper
from events.subjects import subject_for, task_events, task_subject
from events.synthetic import synthetic_history


async def collect(log: EventLog, **kwargs: object) -> list[tuple[int, object]]:
    return [(seq, event) async for seq, event in log.replay(**kwargs)]  # type: ignore[arg-type]


async def test_10k_appends_with_retries_are_stored_once_and_replay_folds_to_the_live_state(event_log: EventLog) -> None:
    events = synthetic_history(10_000)
    seqs = await event_log.append_many(events[:6000])
    assert seqs == list(range(1, 6001))
    # retries of the same event_ids: pipelined, one by one, and mixed with new events
    assert await event_log.append_many(events[1000:2000]) == list(range(1001, 2001))
    assert await event_log.append(events[42]) == 43
    seqs += await event_log.append_many(events[5990:10_000])
    assert seqs[-1] == 10_000
    assert await event_log.message_count() == 10_000
    assert await event_log.last_seq() == 10_000

    live = fold(zip(range(1, 10_001), events, strict=True))
    replayed = await collect(event_log, from_seq=1)
    assert [seq for seq, _ in replayed] == list(range(1, 10_001))
    assert [event for _, event in replayed] == events
    # State equality (canonical_bytes cannot yet encode the int-keyed per-rank dicts; reported)
    assert fold(replayed) == live  # type: ignore[arg-type]
    assert await event_log.fold() == live

    snapshot = fold(zip(range(1, 5001), events[:5000], strict=True))
    tail = await collect(event_log, from_seq=5001)
    assert tail[0][0] == 5001
    assert fold(tail, snapshot) == live  # type: ignore[arg-type]
    assert await event_log.fold(snapshot) == live


async def test_replay_of_an_empty_stream_and_past_the_end_yields_nothing(event_log: EventLog) -> None:
    assert await collect(event_log) == []
    await event_log.append_many(synthetic_history(3))
    assert await collect(event_log, from_seq=4) == []
    assert [seq for seq, _ in await collect(event_log, from_seq=3)] == [3]


async def test_replay_filters_subjects_and_starts_at_a_time(event_log: EventLog) -> None:
    events = synthetic_history(200)
    await event_log.append_many(events[:100])
    await asyncio.sleep(0.05)
    middle = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await event_log.append_many(events[100:])
    later = await collect(event_log, from_time=middle)
    assert [seq for seq, _ in later] == list(range(101, 201))
    task = "task-00000002"
    mine = await collect(event_log, subjects=[task_events(task)])
    assert mine and all(getattr(event, "task_id", None) == task for _, event in mine)
    assert [seq for seq, _ in mine] == sorted(seq for seq, _ in mine)


async def test_poison_messages_are_counted_and_skipped_and_good_ones_all_applied(
    event_log: EventLog, nats_url: str
) -> None:
    events = synthetic_history(300)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    poison = [b"\x00not msgpack", encode(events[0])[:-3], msgspec.msgpack.encode({"type": "no_such_event"})]
    expected_good: list[int] = []
    for index, event in enumerate(events):
        if index % 50 == 25:
            await js.publish(task_subject("bad", "created"), poison[index % 3])
        ack = await js.publish(subject_for(event), encode(event))
        expected_good.append(ack.seq)
    await nc.close()

    replayed = await collect(event_log)
    assert [seq for seq, _ in replayed] == expected_good
    assert event_log.malformed == 6
    state = await event_log.fold()
    assert state.last_seq == expected_good[-1]
    assert len(state.tasks) == len({getattr(e, "task_id", None) for e in events} - {None})
    entries = [entry async for entry in event_log.entries()]
    assert sum(1 for _, event in entries if event is None) == 6


async def test_get_last_finds_the_newest_event_on_a_subject(event_log: EventLog) -> None:
    events = synthetic_history(60)
    seqs = await event_log.append_many(events)
    found = await event_log.get_last(task_subject("task-00000001", "created"))
    assert found is not None
    seq, event = found
    assert event == events[seq - 1] and type(event).__name__ == "TaskCreated"
    assert seq in seqs
    assert await event_log.get_last(task_subject("nope", "created")) is None


async def test_telemetry_goes_to_its_own_stream(event_log: EventLog) -> None:
    stamper = Stamper(Origin(service="worker", node="n1"))
    beats = [
        RunnerHeartbeat(env=stamper.stamp(), instance_id=InstanceId("i1"), rank=r, phase="decode") for r in range(3)
    ]
    for beat in beats:
        await event_log.publish_telemetry(beat)
    await event_log.publish_telemetry(NodeHeartbeat(env=stamper.stamp(), node_id=NodeId("n1")))
    await event_log.flush()
    for _ in range(50):
        if await event_log.last_seq("telemetry") == 4:
            break
        await asyncio.sleep(0.02)
    got = [event async for _, event in event_log.replay(stream="telemetry")]
    assert got[:3] == beats and len(got) == 4
    assert await event_log.last_seq("events") == 0


async def test_ensure_streams_is_idempotent_and_applies_new_retention(event_log: EventLog, nats_url: str) -> None:
    await event_log.ensure_streams()
    settings = LogSettings(events=StreamLimits(max_age_seconds=3600.0, max_bytes=1 << 20), duplicate_window_seconds=30)
    other = await EventLog.connect(nats_url, settings)
    try:
        await other.ensure_streams()
        info = await other._js.stream_info("SHOAL_EVENTS")  # pyright: ignore[reportPrivateUsage]
        assert info.config.max_age == 3600.0 and info.config.max_bytes == 1 << 20
        assert info.config.duplicate_window == 30.0
    finally:
        await other.close()


async def test_follow_continues_live_after_replay_without_gap_or_duplicate(event_log: EventLog) -> None:
    events = synthetic_history(400)
    await event_log.append_many(events[:150])
    seen: list[int] = []

    async def reader() -> None:
        async with aclosing(event_log.follow(from_seq=1)) as stream:
            async for seq, _ in stream:
                seen.append(seq)
                if seq == 400:
                    return

    async with asyncio.timeout(30):
        task = asyncio.create_task(reader())
        for start in range(150, 400, 50):
            await event_log.append_many(events[start : start + 50])
            await asyncio.sleep(0.01)
        await task
    assert seen == list(range(1, 401))


async def test_append_to_a_missing_stream_is_a_clear_error(event_log: EventLog) -> None:
    await event_log.delete_streams()
    fast = EventLog(event_log._client, event_log.endpoint, LogSettings(retry_seconds=0.5))  # pyright: ignore[reportPrivateUsage]
    with pytest.raises(LogError):
        await fast.append_many(synthetic_history(3))
    with pytest.raises(LogError):
        await fast.append(synthetic_history(1)[0])


async def test_connecting_to_no_server_is_a_clear_error_and_a_connection_reconnects_forever(
    event_log: EventLog,
) -> None:
    from services.nats import free_port

    with pytest.raises(LogError, match=r"cannot connect to NATS .* is the server running"):
        await EventLog.connect(f"nats://127.0.0.1:{free_port()}", wait_seconds=0.3)
    with pytest.raises(LogError, match="use nats://host:port or tls://host:port"):
        await EventLog.connect("http://127.0.0.1:4222")
    assert event_log._nc.options["max_reconnect_attempts"] == -1  # pyright: ignore[reportPrivateUsage]


async def test_close_ends_a_follow(event_log: EventLog) -> None:
    await event_log.append_many(synthetic_history(5))
    seen: list[int] = []

    async def follow() -> None:
        async for seq, _ in event_log.follow():
            seen.append(seq)

    async with asyncio.timeout(10):
        task = asyncio.create_task(follow())
        while len(seen) < 5:
            await asyncio.sleep(0.01)
        await event_log.close()
        await task  # ends by itself within a heartbeat interval
    assert seen == [1, 2, 3, 4, 5]


async def test_replaying_a_missing_stream_fails_at_once(event_log: EventLog) -> None:
    await event_log.delete_streams()
    async with asyncio.timeout(5):
        with pytest.raises(LogError, match="stream not found"):
            await collect(event_log)


async def test_a_resend_can_ask_whether_its_event_is_stored(event_log: EventLog) -> None:
    runner = Stamper(Origin(service="runner", node="n1", rank=0))  # random ids: the log is shared
    task_id = TaskId(f"t-{secrets.token_hex(4)}")

    def chunk(text: str) -> ChunkGenerated:
        return ChunkGenerated(env=runner.stamp(), task_id=task_id, index=0, text=text, token_ids=[1])

    first, second = chunk("a"), chunk("b")
    await event_log.append(first)
    assert await event_log.is_newest_on_its_subject(first)
    assert not await event_log.is_newest_on_its_subject(second)  # never sent
    await event_log.append(second)
    assert not await event_log.is_newest_on_its_subject(first)
    assert await event_log.is_newest_on_its_subject(second)
