"""Reading several subject families of the events stream in log order, one consumer per family.

A worker or runner may create only consumers filtered to one subject each, named in the create
request where the server checks it (`services.nats_permissions`: a consumer with several filters
goes by a request that does not name them, so it cannot be allowed to a node). A fold needs its
families in log order all the same (an `InstancePlaced` names nodes that an earlier `NodeJoined`
introduced), so:

- `fold_families` reads each family up to one end, fixed before the first read, and folds the
  merge by seq;
- `follow_families` follows each family live and yields their events in log order. An event of
  one family at seq `s` goes out only once every other family is known up to `s`: a bounded read
  of each other family from the last seq yielded to `s` (its events there go out first, in
  order), so nothing waits for a quiet family's next message. What a family's live consumer
  delivers later at or below the last seq yielded was yielded already and is skipped. Each event
  therefore costs a bounded read per other family: for the few, rare events a worker folds
  (nodes, instances), never for a task's tokens.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Sequence

from loguru import logger

from eventlog.log import EventLog
from eventlog.publish import LogUnreachable
from events.catalogue import LogEvent
from events.fold import Folder
from events.state import State

Entry = tuple[int, LogEvent, bytes]
RETRY_READ_S = 1.0


async def read_family(log: EventLog, family: str, first: int, last: int) -> list[Entry]:
    """The events of `family` stored at seqs `first`..`last` (a bounded read)."""
    if first > last:
        return []
    found: list[Entry] = []
    async for seq, event, subject in log.deliveries(first, [family], live=False):  # to the end as of now
        if seq <= last:
            found.append((seq, event, subject))
    return found


async def read_patiently(log: EventLog, family: str, first: int, last: int) -> list[Entry]:
    """`read_family`, tried again for as long as NATS is away: a live follower waits out an outage
    as its own consumers do (a bounded read alone gives up after the log's retry time, and took
    the worker down with it while a NATS majority was cut off)."""
    while True:
        try:
            return await read_family(log, family, first, last)
        except LogUnreachable as exc:
            logger.info("reading {} up to seq {} waits for NATS: {}", family, last, exc)
            await asyncio.sleep(RETRY_READ_S)


async def fold_families(log: EventLog, families: Sequence[str], state: State) -> State:
    """`state` with every event of `families` after its last seq folded in, in log order, up to
    the end of the stream as of the call."""
    end = await log.last_seq()
    reads = [await read_family(log, family, state.last_seq + 1, end) for family in families]
    folder = Folder(state)
    for seq, event, subject in heapq.merge(*reads, key=lambda entry: entry[0]):
        folder.skip_to(seq)  # the other families' seqs, and deleted messages
        refused = folder.add(seq, event, subject)
        if refused is not None:
            logger.warning("quarantined {} seq {}: {}", subject.decode(errors="replace"), seq, refused)
    folder.skip_to(end + 1)
    return folder.state


async def follow_families(
    log: EventLog, from_seq: int, families: Sequence[str], handle: Callable[[Entry], Awaitable[None]]
) -> None:
    """Hand `handle` the events of `families` from `from_seq` on, live, in log order (see the
    module's doc), until cancelled."""
    arrivals: asyncio.Queue[tuple[int, Entry]] = asyncio.Queue()

    async def feed(index: int, family: str) -> None:
        async for entry in log.deliveries(from_seq, [family]):
            await arrivals.put((index, entry))

    async def merge() -> None:
        yielded = from_seq - 1
        while True:
            index, entry = await arrivals.get()
            seq = entry[0]
            if seq <= yielded:
                continue  # read already by a bounded read of its family
            others = [family for other, family in enumerate(families) if other != index]
            reads = [await read_patiently(log, family, yielded + 1, seq - 1) for family in others]
            for earlier in heapq.merge(*reads, key=lambda found: found[0]):
                await handle(earlier)
            await handle(entry)
            yielded = seq

    async with asyncio.TaskGroup() as group:
        for index, family in enumerate(families):
            group.create_task(feed(index, family))
        group.create_task(merge())
