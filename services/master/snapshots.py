"""The master's snapshots of the State, which every service starts from (`eventlog.snapshots`).

The master writes them because there is one leader at a time, so there is one writer. Its live
fold skips `ChunkGenerated` (it has no use for text, and per token it would take CPU from the
model on a small machine), so a snapshot is not its live State: the writer keeps the complete
State of its last snapshot (or of the master's start-up fold) and, when one is due, brings it up
to the log's end with a batch fold of every event (`EventLog.fold`) — a few milliseconds per
thousand events, paid once per `snapshot_every_events` — so every service that starts from it
(the API's text and token counts included) holds exactly what a fold of the whole log gives.
A stand-by folds it on alike but stores nothing (`store=False`: two writers would only waste work,
each writing a State every replica agrees on, but one is the rule). A write
that fails is logged and retried at the next due point: a snapshot only speeds start-ups up.
"""

from __future__ import annotations

from loguru import logger

from eventlog.log import EventLog
from events.state import State


def snapshot_due(state: State, written_seq: int, every_events: int) -> bool:
    """A snapshot is due once `every_events` events were folded since the last one (0: never)."""
    return every_events > 0 and state.last_seq - written_seq >= every_events


class SnapshotWriter:
    """`complete` is a fold of every event up to its `last_seq` (the master's start-up fold), from
    which each snapshot is folded on; the caller's live State only says when one is due."""

    def __init__(self, log: EventLog, every_events: int, complete: State) -> None:
        self.log = log
        self.every_events = every_events
        self.complete = complete
        self.written_seq = complete.last_seq  # the seq the newest snapshot covers (as far as we know)

    async def write_if_due(self, live: State, *, store: bool = True) -> bool:
        """Write the complete State as the snapshot if one is due by `live`; True when written.
        Leader only; a stand-by passes `store=False` to fold it on all the same, so that taking
        over never starts with a fold of everything since it started."""
        if not snapshot_due(live, self.written_seq, self.every_events):
            return False
        try:
            self.complete = await self.log.fold(self.complete)
            if not store:
                self.written_seq = self.complete.last_seq
                return False
            self.written_seq = await self.log.write_snapshot(self.complete)
        except Exception as exc:  # a snapshot only speeds start-ups up: never worth the master's loop
            logger.opt(exception=exc).warning(
                "snapshot of seq {} not written; retrying at the next tick", live.last_seq
            )
            return False
        logger.info("snapshot of the State written at seq {}", self.complete.last_seq)
        return True
