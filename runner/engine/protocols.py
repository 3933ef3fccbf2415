"""The runner's seams: where cancels come from, where results go, what phase it is in, and who
prepares a batch's newcomers.

The services issue plugs NATS into `CancelSource` and `RunnerSink`; tests plug in lists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from events.logprobs import TokenLogprob
from events.vocabulary import Phase, PrefillPath

if TYPE_CHECKING:
    from runner.engine.preparation import Prepared
    from runner.engine.requests import GenerationRequest


class CancelSource(Protocol):
    def is_cancelled(self, task_id: str) -> bool:
        """Non-blocking: has anyone asked to stop `task_id`? Called at every prefill iteration."""
        ...


class RunnerSink(Protocol):
    def prefill_started(
        self, task_id: str, path: PrefillPath, prompt_tokens: int, chunks: int, step: int, cached_tokens: int = 0
    ) -> None:
        """`cached_tokens`: prompt tokens reused from the prefix cache (the chunks cover the rest)."""
        ...

    def prefill_progress(self, task_id: str, processed: int, total: int, iteration: int) -> None: ...

    def tokens(
        self,
        task_id: str,
        index: int,
        text: str,
        token_ids: list[int],
        logprobs: list[TokenLogprob] | None = None,
        choice: int = 0,
    ) -> None:
        """Sampling rank only; `index` is the position of token_ids[0] in the completion of
        `choice` (a task of several: `GenerationRequest.n`); `logprobs` one per token id, when the
        request asked for them."""
        ...


class PeerWait(Protocol):
    def wait(self) -> None:
        """Block, without spinning, until bytes from the left ring neighbour are readable (or a
        bounded time passed). Called only before a receive whose message the neighbour sends
        without waiting on this rank (an activation, a message of the agreement), so it always
        ends; it reads nothing, so it cannot change what the receive gets."""
        ...


class Preparer(Protocol):
    """Prepares a batch's pending requests (`Engine.prepare`), perhaps off the step loop (`preparation.py`)."""

    def start(self, request: GenerationRequest) -> None:
        """Begin preparing `request`; once per task id (again: nothing)."""
        ...

    def ready(self, task_id: str) -> bool: ...

    def wait(self, task_id: str, timeout_seconds: float) -> None:
        """Until `task_id` is ready or the timeout passed."""
        ...

    def take(self, task_id: str) -> Prepared:
        """A ready preparation, forgotten here; an error the preparation raised is raised here."""
        ...

    def discard(self, task_id: str) -> None: ...


class NeverCancelled:
    def is_cancelled(self, task_id: str) -> bool:
        return False


class NullSink:
    def prefill_started(
        self, task_id: str, path: PrefillPath, prompt_tokens: int, chunks: int, step: int, cached_tokens: int = 0
    ) -> None:
        pass

    def prefill_progress(self, task_id: str, processed: int, total: int, iteration: int) -> None:
        pass

    def tokens(
        self,
        task_id: str,
        index: int,
        text: str,
        token_ids: list[int],
        logprobs: list[TokenLogprob] | None = None,
        choice: int = 0,
    ) -> None:
        pass


@dataclass(frozen=True, slots=True)
class PhaseSnapshot:
    phase: Phase
    task_id: str | None
    iteration: int
    since_ns: int  # time.monotonic_ns() when the phase was entered


class PhaseTracker:
    """Where the main thread is, readable from a heartbeat thread.

    The engine calls `enter` at every phase change and every prefill iteration; a reader that
    sees an old `since_ns` knows the main thread is stuck inside that phase. Each change swaps in
    a new immutable snapshot with one attribute store, so a reader on another thread sees the old
    snapshot or the new one, never a mix: no lock is needed (and the engine imports no threading).
    """

    def __init__(self) -> None:
        self._current = PhaseSnapshot("idle", None, 0, time.monotonic_ns())

    def enter(self, phase: Phase, task_id: str | None = None, iteration: int = 0) -> None:
        snapshot = PhaseSnapshot(phase, task_id, iteration, time.monotonic_ns())
        self._current = snapshot

    def snapshot(self) -> PhaseSnapshot:
        return self._current
