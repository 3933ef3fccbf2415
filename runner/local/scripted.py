"""Cancel sources and sinks for local runs and tests (no MLX).

`ScriptedCancel` counts the engine's polls of one task: poll i of a task is prefill iteration
i while prefill lasts (the engine polls exactly once per iteration, idle ones included), then
decode polls. A test can therefore cancel "at prefill iteration 3 on rank 1" exactly.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field


@dataclass(slots=True)
class ScriptedCancel:
    fire_at_poll: int | None = None  # None: never
    die_at_poll: int | None = None  # fault injection: SIGKILL this process at that poll
    freeze_at_poll: int | None = None  # fault injection: SIGSTOP it (a rank that stalls)
    polls: int = 0

    def is_cancelled(self, task_id: str) -> bool:
        poll = self.polls
        self.polls += 1
        if self.die_at_poll is not None and poll >= self.die_at_poll:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.freeze_at_poll is not None and poll >= self.freeze_at_poll:
            os.kill(os.getpid(), signal.SIGSTOP)
        return self.fire_at_poll is not None and poll >= self.fire_at_poll


@dataclass(slots=True)
class BrokenCancel:
    """A cancel source whose backend is down (tests: the group must still agree)."""

    def is_cancelled(self, task_id: str) -> bool:
        raise ConnectionError("cancel subscription lost")


@dataclass(slots=True)
class FixedCancel:
    cancelled: bool

    def is_cancelled(self, task_id: str) -> bool:
        return self.cancelled


@dataclass(slots=True)
class RecordingSink:
    started: list[dict[str, object]] = field(default_factory=list)
    progress: list[tuple[int, int, int]] = field(default_factory=list)
    chunks: list[tuple[int, str, list[int]]] = field(default_factory=list)
    fail_on_tokens: bool = False  # tests: a sink whose publisher broke mid-task

    def prefill_started(self, task_id: str, path: str, prompt_tokens: int, chunks: int, step: int) -> None:
        self.started.append({"path": path, "prompt_tokens": prompt_tokens, "chunks": chunks, "step": step})

    def prefill_progress(self, task_id: str, processed: int, total: int, iteration: int) -> None:
        self.progress.append((processed, total, iteration))

    def tokens(self, task_id: str, index: int, text: str, token_ids: list[int]) -> None:
        if self.fail_on_tokens:
            raise ConnectionError("publisher closed")
        self.chunks.append((index, text, list(token_ids)))
