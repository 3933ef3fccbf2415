"""A newcomer prepared off the step loop: its request checked and, on the sampling rank, its grammar
compiled, while the batch's rows keep decoding.

Checking a constrained request means building its grammar (`runner.models.grammar`), and the
sampling rank then compiles it into a matcher: for a large JSON schema that is up to a second of
work on a rank's main thread, during which every stream of the batch would get no token. So a
runner prepares a pending assignment with a grammar on a worker thread of its shell
(`runner.preparer`; llguidance releases the GIL while it compiles), one without at once, where it
costs microseconds; this module holds what is pure: the proposals and the verdicts. Until it is
ready on every rank the batch does not admit it (the step's agreement carries each rank's "still
preparing": `batch_plan.PREPARING`), so every rank admits it at the same step and every rank's
verdict on it (the same checks of the same request) is known by then; the assignments after it in
the log that are ready join past it (`step_plan.ready_to_admit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.engine.batch_plan import PREPARING, Proposal
from runner.engine.prefix_cache import PrefixIndex, PrefixMatch

if TYPE_CHECKING:
    from runner.engine.batch_streams import Admission
    from runner.engine.constraints import TokenMask
    from runner.engine.protocols import Preparer
    from runner.engine.requests import GenerationRequest


@dataclass(frozen=True, slots=True)
class Prepared:
    """What admitting a request needs from its preparation."""

    error: str | None = None  # why it cannot run (the same on every rank): it fails alone
    token_mask: TokenMask | None = None  # its compiled grammar, on the sampling rank


IDLE_WAIT_SECONDS = 0.05  # an idle batch's wait for its next newcomer's preparation


class Newcomers:
    """One rank's pending assignments until admitted: the cached prefix it proposes for each (looked
    up once and held, so what it proposed is still there when the batch agrees) and its preparation,
    taken from the preparer once ready and held, so the step's plan reads its verdict (`invalid`)."""

    def __init__(self, prefixes: PrefixIndex[list[Any]], preparations: Preparer) -> None:
        self.prefixes = prefixes
        self.preparations = preparations
        self._held: dict[str, PrefixMatch[list[Any]] | None] = {}
        self._prepared: dict[str, Prepared] = {}

    def propose(self, pending: Sequence[Admission], idle: bool) -> list[Proposal]:
        """This rank's proposal for each of `pending` (`batch_plan.StepLayout.encode`): the prompt
        tokens its prefix cache serves, None where it has no request, PREPARING until prepared. An
        `idle` batch (no members) first waits a little for the first one's preparation rather than
        agreeing in a tight loop while only a grammar compiles."""
        proposals: list[Proposal] = []
        for admission in pending:
            request = admission.request
            if admission.task_id not in self._held:
                self._held[admission.task_id] = (
                    None if request is None else self.prefixes.longest(request.prompt_token_ids, request.cache_scope)
                )
                if request is not None:
                    self.preparations.start(request)
            if request is None:
                proposals.append(None)
                continue
            if idle and not proposals:
                self.preparations.wait(admission.task_id, IDLE_WAIT_SECONDS)
            match = self._held[admission.task_id]
            ready = self._take_if_ready(admission.task_id)
            proposals.append(PREPARING if not ready else 0 if match is None else match.length)
        return proposals

    def _take_if_ready(self, task_id: str) -> bool:
        if task_id not in self._prepared and self.preparations.ready(task_id):
            self._prepared[task_id] = self.preparations.take(task_id)
        return task_id in self._prepared

    def invalid(self, task_id: str) -> str | None:
        """Why `task_id`'s request cannot run (its preparation's verdict: the same checks of the
        same request on every rank), once this rank proposed it prepared; None otherwise."""
        prepared = self._prepared.get(task_id)
        return None if prepared is None else prepared.error

    def admit(self, task_id: str, runs: bool) -> tuple[PrefixMatch[list[Any]] | None, Prepared | None]:
        """What this rank held for `task_id`, admitted now: its prefix match and, if it `runs` (agreed),
        its preparation (held since this rank proposed it: only what every rank proposed prepared is
        admitted, `step_plan.ready_to_admit`)."""
        match = self._held.pop(task_id, None)
        prepared = self._prepared.pop(task_id, None)
        if not runs:
            if prepared is None:
                self.preparations.discard(task_id)
            return match, None
        if prepared is None:
            raise RuntimeError(f"internal error: {task_id} admitted before this rank proposed it prepared")
        return match, prepared


class PrepareInline:
    """A `Preparer` that prepares every request at once, on the step loop (a batch built without a
    shell's thread: `runner.preparer.ThreadedPreparer` is the one that takes grammars off the loop)."""

    def __init__(self, prepare: Callable[[GenerationRequest], Prepared]) -> None:
        self._prepare = prepare
        self._done: dict[str, Prepared] = {}

    def start(self, request: GenerationRequest) -> None:
        if request.task_id not in self._done:
            self._done[request.task_id] = self._prepare(request)

    def ready(self, task_id: str) -> bool:
        return task_id in self._done

    def wait(self, task_id: str, timeout_seconds: float) -> None:
        pass  # prepared at `start`

    def take(self, task_id: str) -> Prepared:
        return self._done.pop(task_id)

    def discard(self, task_id: str) -> None:
        self._done.pop(task_id, None)
