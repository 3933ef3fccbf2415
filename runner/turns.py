"""Waiters served in turns by key: the pure order behind every queue shoal shares fairly between
API keys, so one key's burst holds another key's request back by at most one job per worker.

The API's lanes (`services/api/fair_lane.py`: threads that check grammars and size prompts) and
the runner's grammar preparation (`runner/preparer.py`: one thread that compiles newcomers'
grammars) serve their waiters in this order: of the keys waiting, the one that holds the fewest
workers, then the one served least recently; each key's waiters in arrival order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Turns(Generic[T]):
    """Waiters by key. `next` serves, of the waiting keys, the one that holds the fewest threads
    (`busy`), then the one served least recently (never, first; then in the order keys came), its
    first waiter. A key that neither waits nor holds a thread is forgotten: its turn starts afresh."""

    def __init__(self) -> None:
        self._queues: dict[Hashable, deque[T]] = {}  # insertion order: the order keys came
        self._served_at: dict[Hashable, int] = {}
        self._serves = 0

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def join(self, key: Hashable, waiter: T) -> None:
        self._queues.setdefault(key, deque()).append(waiter)

    def leave(self, key: Hashable, waiter: T) -> bool:
        """Take `waiter` out (it stopped waiting); False if it is not waiting (already served)."""
        queue = self._queues.get(key)
        if queue is None or waiter not in queue:
            return False
        queue.remove(waiter)
        if not queue:
            del self._queues[key]
        return True

    def next(self, busy: Mapping[Hashable, int] | None = None) -> tuple[Hashable, T] | None:
        """The key served next and its waiter; `busy`: the threads each key holds now."""
        if not self._queues:
            return None
        held = busy or {}
        key = min(self._queues, key=lambda k: (held.get(k, 0), self._served_at.get(k, 0)))  # first of equals
        queue = self._queues[key]
        waiter = queue.popleft()
        if not queue:
            del self._queues[key]
        self.served(key, held)
        return key, waiter

    def served(self, key: Hashable, busy: Mapping[Hashable, int] | None = None) -> None:
        """`key` got a thread (from `next`, or a free one without waiting)."""
        self._serves += 1
        self._served_at[key] = self._serves
        held = busy or {}
        idle = [k for k in self._served_at if k != key and k not in self._queues and not held.get(k)]
        for gone in idle:
            del self._served_at[gone]
