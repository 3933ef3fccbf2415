"""Stamping envelopes with an injected clock and id source, so cores stay deterministic."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from events.catalogue import Envelope, Origin
from events.ids import EventId


def random_event_id() -> str:
    return secrets.token_hex(12)


class Stamper:
    """Makes envelopes for one publisher. Clock and ids are injectable for tests."""

    def __init__(
        self,
        origin: Origin,
        *,
        wall_ns: Callable[[], int] = time.time_ns,
        mono_ns: Callable[[], int] = time.monotonic_ns,
        new_id: Callable[[], str] = random_event_id,
    ) -> None:
        self.origin = origin
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._new_id = new_id

    def stamp(self, event_id: str | None = None) -> Envelope:
        """An envelope; pass `event_id` to make a decision idempotent (same cause, same id)."""
        return Envelope(
            event_id=EventId(event_id if event_id is not None else self._new_id()),
            origin=self.origin,
            wall_time=self._wall_ns(),
            mono_ns=self._mono_ns(),
        )
