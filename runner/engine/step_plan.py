"""One batch step as data, pure: what a rank computes before the step's agreement (`plan_work`), and
everything that agreement decides (`plan_step`).

A step on every rank (`batch.ContinuousBatch.step`, the executor) is: the work `plan_work` names
(the prompt chunks taken, or a lone prompt's whole pipelined prefill; the rank's micro-batch of
decoding rows), the step's one all-reduce (`batch_plan.StepLayout`), then the `StepPlan` that
`plan_step` derives from the agreed vector: who leaves (cancelled, stopped), which followers are
handed their leader's prompt, who joins the decoding rows and in which micro-batch, which pending
assignments are admitted, and for each its prefix reuse and chunks or why it fails, and the
micro-batch schedule of the next step. The executor applies it: the cache joins and filters, the
endings, the new streams.

The invariant (docs/ARCHITECTURE.md §6) is why this is one pure function of agreed data: every rank
builds the same `BatchState` (the composition, the micro-batches' rows, each stream's chunks: all
derived from earlier agreements), agrees on the same vector and applies the same stop rules to the
same tokens, so every rank computes the same plan and issues the same forwards and collectives.
Nothing a rank alone observes enters it: a rank's pending list may be longer than its peers' (it
read assignments they have not), but only the first `agreed.received - admitted` of them (the same
ids on every rank) can be admitted. Its properties are checked in tests/runner/test_step_plan.py.

The work of a step depends on the batch only: one chunk group at most (`chunk_takers`), one
micro-batch per rank (`MicroLayout.working`), so every rank issues one all-reduce per step.

Read top-down: the state and the two plans, then the rules they apply: `next_composition` (who
leaves, who joins the rows, which assignments are admitted: in log order, past any a rank still
prepares, within `max_batch` and the agreed KV capacity), `chunk_takers` and `MicroLayout` (the
micro-batches of the decode ring: `decode_schedule.py` is its schedule).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress

from events.vocabulary import PrefillPath
from runner.engine.batch_plan import AgreedStep
from runner.engine.choices import admission_width, choice_rows, task_of
from runner.engine.decode_schedule import DecodeSchedule, next_iteration
from runner.engine.kv_budget import admissible, too_large
from runner.engine.pace import chunk_room
from runner.engine.plan import PathChoice, newcomer_prefill

UNRUNNABLE_ELSEWHERE = (
    "another rank of the instance could not build this request (it was not handed the task's TaskCreated)"
)


@dataclass(frozen=True, slots=True)
class BatchState:
    """What every rank holds alike of its batch at a step (all derived from earlier agreements)."""

    world: int
    max_batch: int
    step: int
    micro: MicroLayout
    prefilling: tuple[Waiting, ...] = ()  # in slot order: the first takes the step's first chunk
    admitted: int = 0  # assignments admitted so far
    reserved: Mapping[str, int] = field(default_factory=dict)  # each member row's KV reservation
    chunks_in_flight: bool = False  # a chunk group still has a rank to reach (`chunk_ring.ChunkRing.busy`)
    last_join_step: int | None = None  # the step at whose end a stream last joined the rows
    prefill_step_size: int = 512
    keys_per_token: float | None = None  # the agreed chunk cost rate (`Engine.prefill_keys_per_token`)
    prefill_budget: float = 0.0  # what a step's chunk group may cost beyond its first chunk (`chunk_takers`)
    choices_error: str | None = None  # why this model cannot run n > 1 (`choices.hands_prompt`); None: it can

    @property
    def current(self) -> Composition:
        """The step's slots: the boundary micro-batch's rows, then the prefilling streams."""
        return Composition(self.micro.boundary_rows(), tuple(w.row for w in self.prefilling), self.admitted)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A stream admitted and not decoding yet, as the plan sees it."""

    row: str
    path: PrefillPath = "sequential"
    chunks_left: int = 0  # prompt chunks not taken yet
    next_chunk_cost: float | None = None  # `plan.prefill_cost` of its next chunk; None once all are taken
    landed: bool = False  # every chunk past the last rank by this step's agreement (or handed its leader's prompt)
    leader: str | None = None  # a follower of several choices: the row whose prompt KV it is handed
    awaiting_leader: bool = False  # a follower not handed its leader's prompt yet


@dataclass(frozen=True, slots=True)
class Pending:
    """A pending assignment as every rank that built it knows it (from its request alone)."""

    task_id: str
    built: bool = True  # this rank built its request (else `error` says why, or another rank's failure)
    error: str | None = None  # why this rank could not build it
    invalid: str | None = None  # why its request cannot run: its preparation's verdict (alike on every rank)
    n: int = 1  # completions (`choices.py`)
    prompt_len: int = 2
    prefill_path: PathChoice = "auto"
    reserved: int = 0  # one row's KV reservation (`Engine.kv_reservation`)


@dataclass(frozen=True, slots=True)
class StepWork:
    """What every rank computes at a step before its agreement."""

    takers: tuple[str, ...]  # the prefilling streams that take their next chunk, in slot order
    pipeline: bool  # the one taker prefills its whole prompt on the GPipe schedule (admitted alone)
    chunk_cost: float  # what the takers' chunks cost (`plan.prefill_cost`): the pace's measure
    sole: bool  # a lockstep step with no chunk to compute or in flight: ranks compute it one after another
    joining: bool  # a stream may join the rows at the end of this step, or joined at the end of the last


def plan_work(state: BatchState) -> StepWork:
    """The first stream with a chunk left takes it, and any later one whose chunk still fits the
    step's budget (`chunk_takers`); a stream admitted alone on the pipeline path takes
    its whole prefill instead, with nothing beside it."""
    costs = [w.next_chunk_cost for w in state.prefilling]
    taking = chunk_takers(costs, state.prefill_budget)
    pipeline = bool(taking) and state.prefilling[taking[0]].path == "pipeline"
    if pipeline:
        taking = taking[:1]
    takers = tuple(state.prefilling[i].row for i in taking)
    left = {w.row: w.chunks_left for w in state.prefilling}
    for row in takers:
        left[row] = 0 if pipeline else left[row] - 1
    joined_last = state.last_join_step is not None and state.last_join_step == state.step - 1
    return StepWork(
        takers=takers,
        pipeline=pipeline,
        chunk_cost=sum(costs[i] or 0.0 for i in taking),
        sole=state.micro.lockstep and not state.prefilling and not state.chunks_in_flight,
        joining=any(chunks <= 0 for chunks in left.values()) or joined_last,
    )


@dataclass(frozen=True, slots=True)
class StepPlan:
    transition: Transition  # leaves, joins, newcomers, and the slots of the next step
    handed: tuple[str, ...]  # followers handed their leader's prompt KV at this step (`choices.py`)
    boundary: int | None  # the micro-batch whose rows leave and join (its old index)
    join_target: int | None  # where `transition.joined` join (its old index)
    admissions: tuple[Admit | Refuse, ...]  # the newcomers, in log order
    micro: MicroLayout  # the next step's micro-batches, after the leaves and joins
    order: tuple[int, ...]  # where each of `micro`'s micro-batches was this step

    @property
    def composition(self) -> Composition:
        """The next step's streams not decoding yet (its rows are in `micro`): the newcomers refused
        at admission never take a step."""
        composition = self.transition.composition
        refused = [v.task_id for v in self.admissions if isinstance(v, Refuse)]
        return Composition((), composition.prefilling, composition.admitted).without(refused)


@dataclass(frozen=True, slots=True)
class Admit:
    """A newcomer's prefill: the agreed prefix it reuses, then `chunks` on `path`."""

    task_id: str
    index: int  # among this step's pending assignments (its agreed proposal's)
    cached: int
    path: PrefillPath
    chunks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Refuse:
    """A newcomer that fails alone at admission, the same verdict on every rank."""

    task_id: str
    index: int
    error: str
    invalid_request: bool  # for the request itself; False: some rank could not build it


def plan_step(state: BatchState, agreed: AgreedStep, stopped: frozenset[str], pending: Sequence[Pending]) -> StepPlan:
    """Everything the step's agreement decides. `stopped`: the boundary rows whose agreed token hit
    a stop rule or their `max_tokens` (every rank applies the same rules to the same tokens);
    `pending`: this rank's assignments not yet admitted, in log order."""
    micro, current = state.micro, state.current
    boundary, target = micro.boundary(), micro.join_target()
    handed = _handed(state)
    prefilled = frozenset(w.row for w in state.prefilling if w.landed or w.row in handed)
    widths = _widths(state, pending, agreed.runnable)
    needs = _reservations(state, pending, agreed.runnable, widths) if pending else None
    in_flight = micro.rows_in_flight()
    transition = next_composition(
        current,
        agreed,
        stopped_rows=stopped,
        prefilled=prefilled,
        join_room=0 if target is None else micro.join_room(len(prefilled)),
        pending=[p.task_id for p in pending],
        max_batch=state.max_batch - len(in_flight),
        reservations=needs,
        reserved_elsewhere=[needs[t] for t in in_flight] if needs else (),
        widths=widths,
    )
    parts = list(micro.parts)
    if boundary is not None:
        parts[boundary] = tuple(t for t in transition.composition.rows if t not in transition.joined)
    if target is not None:
        parts[target] = (*parts[target], *transition.joined)
    after, order = MicroLayout(micro.world, tuple(parts), micro.iteration).advanced()
    return StepPlan(
        transition=transition,
        handed=handed,
        boundary=boundary,
        join_target=target if transition.joined else None,
        admissions=_admissions(state, agreed, pending, transition, decoding=bool(after.rows)),
        micro=after,
        order=order,
    )


def _handed(state: BatchState) -> tuple[str, ...]:
    """Followers whose leader's prefill lands at this step (a leader is landed once it decodes)."""
    landed = {w.row for w in state.prefilling if w.landed} | set(state.micro.rows)
    return tuple(w.row for w in state.prefilling if w.awaiting_leader and w.leader in landed)


def _widths(state: BatchState, pending: Sequence[Pending], runnable: Sequence[bool]) -> dict[str, int]:
    """The rows each pending assignment takes (`choices.admission_width`): one for a request some
    rank could not build (agreed: `runnable`), since the rank without it cannot know its `n`, and
    every rank must count the same rows."""
    return {
        p.task_id: admission_width(p.n, state.max_batch) if p.built and index < len(runnable) and runnable[index] else 1
        for index, p in enumerate(pending)
    }


def _reservations(
    state: BatchState, pending: Sequence[Pending], runnable: Sequence[bool], widths: Mapping[str, int]
) -> dict[str, int]:
    """The KV positions every member and the agreed pending assignments may come to hold: 0 for
    one no rank can run (it fails at admission), one row's times its width for several choices."""
    held = dict(state.reserved)
    for assignment, can_run in zip(pending, runnable, strict=False):
        held[assignment.task_id] = (
            assignment.reserved * widths[assignment.task_id] if can_run and assignment.built else 0
        )
    return held


def _admissions(
    state: BatchState, agreed: AgreedStep, pending: Sequence[Pending], transition: Transition, decoding: bool
) -> tuple[Admit | Refuse, ...]:
    """Each newcomer's verdict. One admitted into an empty batch (no rows, nothing else waiting or in
    flight) takes the path a task alone would; the others' chunks ride the rows' steps, each leaving
    the agreed pace's room for their decode (`plan.newcomer_prefill`)."""
    joining = set(transition.newcomers)
    if not joining:
        return ()
    alone = not decoding and len(transition.composition.prefilling) == 1 and not state.chunks_in_flight
    room = chunk_room(agreed.decode_share) if decoding else 1.0
    verdicts: list[Admit | Refuse] = []
    for index, assignment in enumerate(pending):
        if assignment.task_id not in joining:
            continue
        verdicts.append(_verdict(state, assignment, index, agreed, alone=alone, room=room))
    return tuple(verdicts)


def _verdict(
    state: BatchState, assignment: Pending, index: int, agreed: AgreedStep, *, alone: bool, room: float
) -> Admit | Refuse:
    task_id = assignment.task_id
    if not assignment.built or not agreed.runnable[index]:
        return Refuse(task_id, index, assignment.error or UNRUNNABLE_ELSEWHERE, invalid_request=False)
    if assignment.invalid is not None:
        return Refuse(task_id, index, assignment.invalid, invalid_request=True)
    if assignment.n > state.max_batch:
        error = f"n={assignment.n} completions need as many rows of the batch, over this instance's max_batch={state.max_batch}"
        return Refuse(task_id, index, error, invalid_request=True)
    if (error := too_large(assignment.reserved * assignment.n, agreed.kv_capacity)) is not None:
        return Refuse(task_id, index, error, invalid_request=True)
    if assignment.n > 1 and state.choices_error is not None:
        return Refuse(task_id, index, state.choices_error, invalid_request=True)
    cached = agreed.cached[index]
    path, chunks = newcomer_prefill(
        assignment.prompt_len,
        state.prefill_step_size,
        state.world,
        assignment.prefill_path,
        alone=alone,
        cached=cached,
        keys=state.keys_per_token,
        room=room,
    )
    return Admit(task_id, index, cached, path, tuple(chunks))


@dataclass(frozen=True, slots=True)
class Composition:
    rows: tuple[str, ...] = ()  # decoding streams, in the batch cache's row order
    prefilling: tuple[str, ...] = ()  # admitted, not decoding yet; the first gets the prefill chunk
    admitted: int = 0  # assignments admitted so far (not always the log's first: `ready_to_admit`)

    @property
    def members(self) -> tuple[str, ...]:
        return self.rows + self.prefilling

    def without(self, task_ids: Sequence[str]) -> Composition:
        """Newcomers that failed before their first step (bad request): they never took a step;
        every row of a task of several choices goes with it."""
        gone = set(task_ids)
        return Composition(
            rows=tuple(t for t in self.rows if task_of(t) not in gone),
            prefilling=tuple(t for t in self.prefilling if task_of(t) not in gone),
            admitted=self.admitted,
        )


@dataclass(frozen=True, slots=True)
class Transition:
    composition: Composition
    kept_rows: tuple[int, ...]  # indices of the old rows that stay, in order (the cache filter)
    cancelled: tuple[str, ...]  # members that leave cancelled
    finished: tuple[str, ...]  # rows that leave on a stop rule (EOS, stop string, max_tokens)
    joined: tuple[str, ...]  # prefilled streams appended as the last rows, in order
    newcomers: tuple[str, ...]  # admitted now, in log order, appended to `prefilling`


def next_composition(
    current: Composition,
    agreed: AgreedStep,
    *,
    stopped_rows: frozenset[str],
    prefilled: frozenset[str],
    join_room: int,
    pending: Sequence[str],
    max_batch: int,
    reservations: Mapping[str, int] | None = None,
    reserved_elsewhere: Sequence[int] = (),
    widths: Mapping[str, int] | None = None,
) -> Transition:
    """The batch of the next step. `stopped_rows`: rows whose agreed token hit a stop rule (every rank
    applies the same rules to the same tokens); `prefilled`: prefilling streams with no prompt chunk
    left; `join_room`: how many of them the decoding rows take now (`MicroLayout.join_room`);
    `pending`: this rank's assignments not yet admitted, in log order (every rank's list starts with
    the same `agreed.received - current.admitted` ids), admitted in log order, past any one a rank
    still prepares (`agreed.prepared`: it waits, `ready_to_admit`); `reservations`: the KV positions
    each member and pending assignment may come to hold (`kv_budget.reservation`; 0 for one every
    rank fails), within the agreed `kv_capacity` (None: not bounded), beside `reserved_elsewhere`:
    the reservations of the rows in the other micro-batches (mid-ring, they stay); `widths`: the rows
    a pending assignment of several choices takes (`choices.admission_width`; absent: 1), admitted
    whole or not at all, in log order (a wide one waits for room; those after it wait behind it,
    so it is never starved), its rows joining `prefilling` together (`choices.choice_rows`)."""
    quiet = not (any(agreed.cancelled) or stopped_rows or current.prefilling or pending)
    if quiet and agreed.received == current.admitted:  # the common step: nobody leaves, joins or waits
        return Transition(current, tuple(range(len(current.rows))), (), (), (), ())
    members = current.members
    cancelled = tuple(compress(members, agreed.cancelled))
    gone = set(cancelled)
    finished = tuple(t for t in current.rows if t in stopped_rows and t not in gone)
    gone.update(finished)
    kept_rows = tuple(i for i, t in enumerate(current.rows) if t not in gone)
    rows = [current.rows[i] for i in kept_rows]
    prefilling = [t for t in current.prefilling if t not in gone]
    joined = tuple(t for t in prefilling if t in prefilled)[: max(0, join_room)]
    rows.extend(joined)
    prefilling = [t for t in prefilling if t not in joined]
    room = max_batch - len(rows) - len(prefilling)
    available = agreed.received - current.admitted
    if available > len(pending):
        raise ValueError(f"agreed {agreed.received} assignments but this rank holds {current.admitted + len(pending)}")
    width = (lambda t: 1) if widths is None else (lambda t: widths.get(t, 1))
    candidates = _fitting(ready_to_admit(pending[: max(0, available)], agreed.prepared), width, room)
    if reservations is not None:
        held = [*reserved_elsewhere, *(reservations.get(t, 0) for t in (*rows, *prefilling))]
        wanted = [reservations.get(t, 0) for t in candidates]
        candidates = candidates[: admissible(held, wanted, agreed.kv_capacity)]
    newcomers = tuple(candidates)
    joining = tuple(row for t in newcomers for row in choice_rows(t, width(t)))
    composition = Composition(
        rows=tuple(rows), prefilling=(*prefilling, *joining), admitted=current.admitted + len(newcomers)
    )
    return Transition(composition, kept_rows, cancelled, finished, joined, newcomers)


def _fitting(candidates: Sequence[str], width: Callable[[str], int], room: int) -> list[str]:
    """The first `candidates` whose rows fit in `room`, in order: the first that does not fit stops
    the rest (log order: a task of several choices is not passed by narrower ones)."""
    fitting: list[str] = []
    for candidate in candidates:
        room -= width(candidate)
        if room < 0:
            break
        fitting.append(candidate)
    return fitting


def ready_to_admit(agreed_pending: Sequence[str], prepared: Sequence[bool]) -> list[str]:
    """The assignments every rank holds that may join now, in log order: those no rank still
    prepares (`prepared`, one per pending assignment that carried a proposal: those past it are not
    known yet; empty: a step that carries no preparation, all are ready). One whose grammar still
    compiles waits alone; the ones after it in the log pass it, so a burst of slow grammars never
    holds back a request without one."""
    if not prepared:
        return list(agreed_pending)
    return [t for t, ready in zip(agreed_pending, prepared, strict=False) if ready]


def chunk_takers(next_chunks: Sequence[float | None], budget: float) -> tuple[int, ...]:
    """Which prefilling streams (by index, in slot order) take their next prompt chunk this step;
    `next_chunks[i]`: the cost of stream i's next chunk (`plan.prefill_cost`), None when its prompt
    is in. The first with a chunk always takes it (a long prompt progresses as it would alone); any
    later one whose chunk still fits the `budget` (what `world` fresh first chunks of the prefill
    step cost: each rank computes only its layers of the group) takes it too."""
    takers: list[int] = []
    spent = 0.0
    for index, cost in enumerate(next_chunks):
        if cost is not None and (not takers or spent + cost <= budget):
            takers.append(index)
            spent += cost
    return tuple(takers)


@dataclass(frozen=True, slots=True)
class MicroLayout:
    """The decoding rows' micro-batches as rows only (`micro_batches.MicroBatches` holds their
    caches): which one each rank computes, where the step agrees, where a prefilled stream joins.

    On N ranks the rows ride a ring of N micro-batches (`decode_schedule.DecodeSchedule(N, N)`);
    while one micro-batch holds every row the batch runs in lockstep (`iteration` None). Only the
    boundary micro-batch (whose tokens the step agrees on) changes membership."""

    world: int
    parts: tuple[tuple[str, ...], ...]  # each micro-batch's rows, in its cache's row order
    iteration: int | None = None  # the ring's; None: lockstep (parts[0] alone holds rows)

    @property
    def lockstep(self) -> bool:
        return self.iteration is None

    @property
    def rows(self) -> tuple[str, ...]:
        return tuple(t for part in self.parts for t in part)

    def working(self, rank: int) -> int | None:
        """The micro-batch `rank` computes at this step (None: an idle slot of the ring)."""
        if self.iteration is None:
            return 0
        return DecodeSchedule(self.world, self.world).work(rank, self.iteration)

    def boundary(self) -> int | None:
        """The micro-batch whose tokens this step agrees on (None: the ring is still filling)."""
        return self.working(self.world - 1)

    def boundary_rows(self) -> tuple[str, ...]:
        boundary = self.boundary()
        return () if boundary is None else self.parts[boundary]

    def join_target(self) -> int | None:
        """Where a prefilled stream joins now, if it may: in lockstep the empty second micro-batch
        (starting the ring) unless the first is empty; on the ring the boundary one (None while the
        ring fills), up to its share (`join_room`)."""
        boundary = self.boundary()
        if self.iteration is None and self.parts[0] and len(self.parts) > 1:
            return 1
        return boundary

    def join_room(self, waiting: int) -> int:
        """How many of `waiting` prefilled streams may join `join_target` now. One micro-batch: all
        of them (nothing to balance). Several: as many as bring the target to its share of every
        row, decoding or waiting, over the micro-batches (rounded up), so a burst is in once each
        micro-batch's boundary came by, and the ring stays balanced (it moves with its largest
        micro-batch); in lockstep at least one, which starts the ring."""
        target = self.join_target()
        if len(self.parts) == 1:
            return waiting
        if target is None:
            return 0
        share = -(-(len(self.rows) + waiting) // len(self.parts))
        room = share - len(self.parts[target])
        return min(waiting, max(1, room) if self.iteration is None else max(0, room))

    def rows_in_flight(self) -> tuple[str, ...]:
        """The rows of every micro-batch but the boundary one: mid-ring, they stay this step."""
        boundary = self.boundary()
        return tuple(t for index, part in enumerate(self.parts) if index != boundary for t in part)

    def advanced(self) -> tuple[MicroLayout, tuple[int, ...]]:
        """After the step's membership changes: the next step's layout, and where each of its
        micro-batches was (a permutation of the indices): back in lockstep, the one micro-batch left
        with rows becomes the first."""
        iteration = next_iteration(self.iteration, [bool(part) for part in self.parts], self.boundary())
        order = list(range(len(self.parts)))
        if iteration is None and not self.parts[0]:
            occupied = next((index for index, part in enumerate(self.parts) if part), None)
            if occupied is not None:
                order[0], order[occupied] = occupied, 0
        return MicroLayout(self.world, tuple(self.parts[i] for i in order), iteration), tuple(order)
