"""A rank's assignments read from the log and not yet admitted, in log order, each becoming the
`Admission` the batch takes: its request built (the task's `TaskCreated` handed over by the
masters, `events.handover`, its messages rendered through the chat template and tokenized).

Building is the runner's only per-request work that grows with the prompt: about 1 s for a
750k-token prompt here, 0.2 s for a long-context model's 128k. Done on the step loop while the
batch runs, every other stream of the batch would get no token for that long. So a large prompt
(`LARGE_PROMPT_BYTES` of `TaskCreated`) is built on a worker thread while the batch keeps stepping
(the tokenizer releases the GIL while it encodes); a small one, or any one while the batch is
idle (nothing to freeze), at once. The batch sees only the built ones, in log order up to the
first still being built: its agreement counts what every rank holds (the least count), so a rank
still tokenizing holds the newcomer back on every rank, exactly as a rank that has not read it from
the log yet does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future
from functools import partial

import msgspec

from events.catalogue import TaskCreated
from runner.engine.batch_streams import Admission
from runner.serial_worker import SerialWorker, settled
from runner.service.bridge import Assignment

LARGE_PROMPT_BYTES = 16_384  # ~4k tokens, ~5 ms to tokenize: below it a thread hop saves nothing


def is_large(created: TaskCreated | None) -> bool:
    """A task whose request takes long to build: a large TaskCreated (its messages, tools or raw
    prompt), or one not carried with its assignment (its build asks the masters for it first)."""
    return created is None or len(msgspec.json.encode(created)) > LARGE_PROMPT_BYTES


class PendingAdmissions:
    def __init__(self, build: Callable[[Assignment], Admission]) -> None:
        self._build = build
        self._entries: deque[Future[Admission]] = deque()
        self._worker = SerialWorker("build-requests")

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, assignment: Assignment, at_once: bool) -> None:
        """`at_once`: built now, on this thread (the batch is idle, or the prompt is small)."""
        call = partial(self._build, assignment)
        self._entries.append(settled(call) if at_once else self._worker.submit(call))

    def built(self) -> list[Admission]:
        """The admissions built so far, in log order, up to the first still being built; an error a
        build raised is raised here, as it was where the build ran on the step loop."""
        ready: list[Admission] = []
        for entry in self._entries:
            if not entry.done():
                break
            ready.append(entry.result())
        return ready

    def wait_first(self, timeout_seconds: float) -> None:
        """Until the first is built, or the timeout passed."""
        if self._entries:
            futures.wait([self._entries[0]], timeout_seconds)

    def pop(self, task_ids: Sequence[str]) -> list[Admission]:
        """The ones the batch admitted (built: it saw them), in log order; the others stay, in log order."""
        wanted = set(task_ids)
        admitted: list[Admission] = []
        kept: deque[Future[Admission]] = deque()
        for entry in self._entries:
            built = entry.done() and entry.exception() is None
            if built and entry.result().task_id in wanted:
                wanted.discard(entry.result().task_id)  # one entry each, as the batch counted them
                admitted.append(entry.result())
            else:
                kept.append(entry)
        self._entries = kept
        return admitted
