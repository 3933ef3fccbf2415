"""The fold's dashboard deltas, fanned out to every open dashboard page (see `services.api.dashboard`),
and the live token rates the pages read each second (`services.api.dashboard_rates`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager

from events.catalogue import LogEvent
from events.ids import InstanceId
from events.state import State
from services.api.dashboard import Delta, Summary, deltas, snapshot
from services.api.dashboard_rates import TokenRates

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
    """Hands each folded event's delta to every open page: computed once, only while one is open.
    Token rates are counted for every event, so a page opened mid-stream shows them at once.
    `configured`: the models the API serves, listed even before any event names them."""

    def __init__(self, configured: Sequence[str] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self.configured = tuple(configured)
        self._clock = clock
        self._rates = TokenRates()
        self._subscriptions: list[Subscription] = []

    def folded(self, before: State, after: State, event: LogEvent) -> None:
        self._rates.observe(before, after, event, self._clock())
        if not self._subscriptions:
            return
        delta = deltas(before, after, event, self.configured)
        if delta is not None:
            for subscription in self._subscriptions:
                subscription.put(delta)

    def snapshot(self, state: State) -> Summary:
        return snapshot(state, self.configured)

    def rates(self) -> dict[InstanceId, float]:
        """Each generating instance's tokens per second now, to one decimal."""
        return {instance_id: round(rate, 1) for instance_id, rate in self._rates.rates(self._clock()).items()}

    @contextmanager
    def subscribe(self) -> Generator[Subscription]:
        subscription = Subscription()
        self._subscriptions.append(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.remove(subscription)
