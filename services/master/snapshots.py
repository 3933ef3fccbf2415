"""The master's snapshots of the State, which every service starts from (`eventlog.snapshots`).

The master writes them because it folds every event anyway and there is one leader at a time, so
there is one writer; a stand-by must not call `SnapshotWriter.write_if_due` (two writers would
only waste work — each writes a State every replica agrees on — but one is the rule). A write
that fails is logged and retried at the next due point: a snapshot only speeds start-ups up.
"""

from __future__ import annotations

import nats.errors
from loguru import logger

from eventlog.log import EventLog
from eventlog.publish import LogError
from events.state import State


def snapshot_due(state: State, written_seq: int, every_events: int) -> bool:
    """A snapshot is due once `every_events` events were folded since the last one (0: never)."""
    return every_events > 0 and state.last_seq - written_seq >= every_events


class SnapshotWriter:
    def __init__(self, log: EventLog, every_events: int, written_seq: int = 0) -> None:
        self.log = log
        self.every_events = every_events
        self.written_seq = written_seq  # the seq the newest snapshot covers (as far as we know)

    async def write_if_due(self, state: State) -> bool:
        """Write `state` as the snapshot if one is due; True when written. Leader only."""
        if not snapshot_due(state, self.written_seq, self.every_events):
            return False
        try:
            self.written_seq = await self.log.write_snapshot(state)
        except (nats.errors.Error, LogError, TimeoutError) as exc:
            logger.warning("snapshot of seq {} not written ({!r}); retrying at the next tick", state.last_seq, exc)
            return False
        logger.info("snapshot of the State written at seq {}", state.last_seq)
        return True
