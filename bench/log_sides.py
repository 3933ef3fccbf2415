"""The sides `shoal bench log` measures; each returns (events per second, what it produced).

Writers (each on freshly recreated streams, the same subjects, bytes and Nats-Msg-Id headers):
- `raw_publish`: a bare nats-py `publish`, no acknowledgement, no shoal code, timed to its
  final flush. The reference the log's append is judged against.
- `raw_js_publish_async`: nats-py's own acknowledged pipelined JetStream publish.
- `append`: `EventLog.append_many`, every append acknowledged by JetStream.
Readers (from seq 1 of the stream the writers left, each decoded with `decode_log_event` and
folded with `Folder`, so only the reading differs):
- `replay`: `EventLog.fold()`, our hand-written protocol reader, batch by batch;
- `replay_nats_py`: nats-py's ordered consumer (a push consumer with flow control; the fastest
  of nats-py's readers here, ahead of `sub.messages` and pull `fetch`), folded in its callback;
- `replay_iterator`: the per-event `async for seq, event in log.replay()`, folded by the caller.
- `replay_tls` (with `--tls`): `replay` from a second embedded server that serves TLS only,
  holding the same events, read with a verified server certificate.
Offline: `fold_export` of a JSON Lines export of the same stream (no NATS), with subjects.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from eventlog.export import fold_export, write_export
from eventlog.log import EventLog
from events.apply import apply
from events.catalogue import LogEvent
from events.codec import ExportRecord, decode_log_event
from events.fold import Folder
from events.state import State
from events.subjects import EVENTS_STREAM, EVENTS_SUBJECTS

Frame = tuple[str, bytes, str]  # subject, payload, Nats-Msg-Id
PENDING_LIMIT = 1 << 30  # the ordered consumer may buffer the whole replay: no slow-consumer drops


def write_syscalls(pid: int) -> int | None:
    """The write system calls process `pid` has made (Linux's /proc/<pid>/io); None where unreadable."""
    try:
        lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith("syscw:")), None)


async def fresh(log: EventLog) -> None:
    await log.delete_streams()
    await log.ensure_streams()


async def raw_publish(url: str, frames: list[Frame]) -> float:
    nc = await nats.connect(url)
    try:
        start = time.perf_counter()
        for subject, payload, event_id in frames:
            await nc.publish(subject, payload, headers={"Nats-Msg-Id": event_id})
        await nc.flush(timeout=60)
        return len(frames) / (time.perf_counter() - start)
    finally:
        await nc.close()


async def raw_js_publish_async(url: str, frames: list[Frame]) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=4096)
    try:
        start = time.perf_counter()
        futures = [await js.publish_async(s, p, headers={"Nats-Msg-Id": i}) for s, p, i in frames]
        await asyncio.gather(*futures)
        return len(frames) / (time.perf_counter() - start)
    finally:
        await nc.close()


async def append(log: EventLog, events: list[LogEvent]) -> tuple[float, list[int]]:
    start = time.perf_counter()
    seqs = await log.append_many(events)
    return len(events) / (time.perf_counter() - start), seqs


async def stored(log: EventLog, count: int, timeout_s: float = 30.0) -> bool:
    """Wait until the stream holds `count` messages (a raw publish is flushed, not acknowledged)."""
    deadline = time.monotonic() + timeout_s
    while await log.last_seq() < count:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return await log.last_seq() == count


async def replay(log: EventLog, count: int) -> tuple[float, State]:
    start = time.perf_counter()
    state = await log.fold()
    return count / (time.perf_counter() - start), state


async def replay_nats_py(url: str, count: int) -> tuple[float, State]:
    nc = await nats.connect(url)
    folder = Folder()
    done = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        folder.add(seq, decode_log_event(msg.data))
        if seq >= count:
            done.set()

    try:
        start = time.perf_counter()
        sub = await nc.jetstream().subscribe(
            EVENTS_SUBJECTS,
            stream=EVENTS_STREAM,
            cb=on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            pending_msgs_limit=PENDING_LIMIT,
            pending_bytes_limit=PENDING_LIMIT,
        )
        await asyncio.wait_for(done.wait(), timeout=300)
        rate = count / (time.perf_counter() - start)
        await sub.unsubscribe()
        return rate, folder.state
    finally:
        await nc.close()


async def replay_iterator(log: EventLog) -> tuple[float, State]:
    start = time.perf_counter()
    state = State()
    replayed = 0
    async for seq, event in log.replay(from_seq=1):
        state = apply(state, seq, event)
        replayed += 1
    return replayed / (time.perf_counter() - start), state


async def export(log: EventLog, path: Path) -> None:
    """As `shoal events export` writes it: with the subject each event was stored on, which the
    offline fold holds it to (`events.subjects.route_refusal`), as a live fold does."""
    with path.open("wb") as out:
        async for seq, event, subject in log.deliveries(from_seq=1, live=False):
            record = ExportRecord(stream="events", seq=seq, event=event, subject=subject.decode(errors="replace"))
            write_export((record,), out)


def offline_fold(path: Path, count: int) -> tuple[float, State]:
    start = time.perf_counter()
    state = fold_export(path)
    return count / (time.perf_counter() - start), state
