"""Live tokens per second per instance, for the dashboard: a sliding window over the tokens the
fold counted. Pure (the caller passes its monotonic clock).

How it is computed: every folded `ChunkGenerated` adds the tokens the fold counted for it (the
task's `completion_tokens` before and after, so a late chunk of an ended task adds none) to its
task's instance, stamped with the chunk's `env.wall_time` (the sampling rank's clock). An
instance's rate is the tokens of its chunks stamped within the last `WINDOW_S` seconds, over
`WINDOW_S`: it rises to the steady rate within one window of a burst starting and falls to 0 one
window after the last chunk. "Now" is the instance's newest chunk stamp plus the time this process
measured since it folded that chunk, so every comparison is made on one clock (that rank's) and a
skew between the hosts never shifts the window; a backlog folded late is still counted at the
times its tokens were made.

The cost per chunk is a dict lookup and a deque append (old entries leave as new ones come), so
the fold is not slowed; a window is dropped when its instance retires.
"""

from __future__ import annotations

from collections import deque

import msgspec

from events.catalogue import ChunkGenerated, InstanceRetired, LogEvent
from events.ids import InstanceId
from events.state import State

WINDOW_S = 5.0
NS_PER_S = 1_000_000_000
WINDOW_NS = int(WINDOW_S * NS_PER_S)


class Rates(msgspec.Struct, frozen=True, kw_only=True):
    """What the page is sent each second the rates changed: tokens per second by instance (an
    instance not named makes none now)."""

    tokens_per_second: dict[InstanceId, float]


class _Window:
    """One instance's recent chunks: (wall ns stamp, tokens), oldest first."""

    def __init__(self) -> None:
        self.chunks: deque[tuple[int, int]] = deque()
        self.newest_at = 0  # the newest stamp
        self.folded_at = 0.0  # when the newest was folded, on the caller's monotonic clock (s)

    def add(self, at: int, tokens: int, now: float) -> None:
        if at >= self.newest_at:
            self.newest_at, self.folded_at = at, now
        self.chunks.append((at, tokens))
        if self.chunks[0][0] <= self.newest_at - WINDOW_NS:
            self._trim(self.newest_at - WINDOW_NS)

    def rate(self, now: float) -> float:
        start = self.newest_at + int((now - self.folded_at) * NS_PER_S) - WINDOW_NS
        self._trim(start)
        return sum(tokens for _at, tokens in self.chunks) / WINDOW_S

    def _trim(self, start: int) -> None:
        while self.chunks and self.chunks[0][0] <= start:
            self.chunks.popleft()


class TokenRates:
    def __init__(self) -> None:
        self._windows: dict[InstanceId, _Window] = {}

    def observe(self, before: State, after: State, event: LogEvent, now: float) -> None:
        """Count `event` (folded from `before` to `after`) at `now` on the monotonic clock."""
        if isinstance(event, ChunkGenerated):  # the hot path: a lookup, a subtraction, an append
            new = after.tasks.get(event.task_id)
            if new is None or new.instance_id is None:
                return
            old = before.tasks.get(event.task_id)
            tokens = new.completion_tokens - (old.completion_tokens if old is not None else 0)
            if tokens > 0:
                window = self._windows.get(new.instance_id)
                if window is None:
                    window = self._windows[new.instance_id] = _Window()
                window.add(event.env.wall_time, tokens, now)
        elif isinstance(event, InstanceRetired):
            self._windows.pop(event.instance_id, None)

    def rates(self, now: float) -> dict[InstanceId, float]:
        """Tokens per second of every instance that made some within the window (others: 0)."""
        found = {instance_id: window.rate(now) for instance_id, window in self._windows.items()}
        return {instance_id: rate for instance_id, rate in sorted(found.items()) if rate > 0}
