"""The fold's dashboard deltas, fanned out to every open dashboard page (see `services.api.dashboard`)."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from contextlib import contextmanager

from events.catalogue import LogEvent
from events.state import State
from services.api.dashboard import Delta, deltas

QUEUE_LIMIT = 1000  # deltas a slow page may fall behind by before it is sent a fresh snapshot instead


class Subscription:
    """One page's deltas, in fold order; `behind` once it fell `QUEUE_LIMIT` behind."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Delta] = asyncio.Queue(QUEUE_LIMIT)
        self.behind = False

    def put(self, delta: Delta) -> None:
        try:
            self.queue.put_nowait(delta)
        except asyncio.QueueFull:
            self.behind = True


class DashboardFeed:
    """Hands each folded event's delta to every open page: computed once, only while one is open."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []

    def folded(self, before: State, after: State, event: LogEvent) -> None:
        if not self._subscriptions:
            return
        delta = deltas(before, after, event)
        if delta is not None:
            for subscription in self._subscriptions:
                subscription.put(delta)

    @contextmanager
    def subscribe(self) -> Generator[Subscription]:
        subscription = Subscription()
        self._subscriptions.append(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.remove(subscription)
