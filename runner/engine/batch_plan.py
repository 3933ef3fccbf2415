"""The continuous batch's decisions, pure: what the batch is at the next step, from agreed data only.

Invariant (docs/ARCHITECTURE.md §6): every rank issues the same collectives, so every rank must
hold the same batch at every step. Each step ends in one all-reduce of one integer vector laid out
by `StepLayout`:

    [ assignments read, one entry per rank | cancel vote per slot | sampled token per slot
      | cached-prefix proposal per rank, per pending assignment (the first `max_batch`)
      | KV capacity, one entry per rank | pace ]

A rank writes its own count of assignments read from the log in its own entry (0 in the others),
so the sum hands every rank every count, and their minimum is how many assignments *all* ranks
hold. The proposals work alike: rank r writes, for each of its first pending assignments, how
many prompt tokens its prefix cache can serve (`prefix_cache.PrefixIndex.longest`); a newcomer
reuses the minimum over ranks (`AgreedStep.cached`, by its index among the newcomers: every rank's
pending list starts with the same ids). A proposal is written as its length plus two, 1 by a rank
still preparing that assignment (its grammar compiling off the step loop: `preparation.py`), and 0
by a rank that could not build its request (it was not handed its `TaskCreated`): a 0 says no rank
may run it (`AgreedStep.runnable`), so every rank fails it alike rather than one rank leaving it
out of the batch the others run, and a 1 that it waits until every rank has it ready
(`AgreedStep.prepared`) while those after it in the log may join past it (`ready_to_admit`). Each
rank writes its KV capacity in tokens of its own layers (`kv_budget.token_capacity`) in its own
entry; the batch admits within the least (`AgreedStep.kv_capacity`). Cancel votes add up (any rank's vote
stops that stream); the sampling rank alone writes the tokens, and rank 0 alone the pace: what its
decode steps cost against a prompt chunk, measured on its clock (`pace.StepPace`), which sizes the
chunks of the newcomers admitted at this step. `next_composition` turns that vector, plus what
every rank derives alike from it (which streams hit a stop rule, which prefills are done), into the
next batch: cancelled and finished streams leave, prefilled streams join the decoding rows (in
order, as many as the micro-batches take), and the assignments not yet admitted that every rank
has ready join in log order while there is room (`max_batch`) and KV (`kv_budget.admissible`).

Slots are `Composition.members` in order: the decoding rows (in the batch cache's row order),
then the streams waiting for or in prefill. Which of those take a prompt chunk at a step is
`chunk_takers`: the first always, then any other whose next chunk still fits the step's prefill
budget, so a burst of short prompts fills the batch in a few steps, not one step per newcomer,
while each rank's prefill work in a step stays within one chunk's (the group is pipelined through
the ranks, so on N ranks the budget is N first chunks: `batch_chunks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Literal

from runner.engine.choices import choice_rows, task_of
from runner.engine.kv_budget import MAX_CAPACITY_TOKENS, admissible
from runner.engine.prefix_cache import agreed_prefix

PREPARING: Literal["preparing"] = "preparing"
Proposal = int | None | Literal["preparing"]  # cached prefix length; None: cannot run it; or PREPARING


@dataclass(frozen=True, slots=True)
class AgreedStep:
    received: int  # assignments every rank has read (the minimum over ranks)
    cancelled: tuple[bool, ...]  # per slot
    tokens: tuple[int, ...]  # per slot; meaningful for decoding rows only
    cached: tuple[int, ...] = ()  # per pending assignment: prompt tokens it reuses if admitted now
    runnable: tuple[bool, ...] = ()  # per pending assignment: every rank could build its request
    prepared: tuple[bool, ...] = ()  # per pending assignment: no rank still prepares it (empty: all are)
    decode_share: int = 0  # rank 0's `pace.StepPace.decode_share`, in thousandths (0: not measured yet)
    kv_capacity: int = MAX_CAPACITY_TOKENS  # KV positions the batch may hold: the least over ranks (`kv_budget`)


@dataclass(frozen=True, slots=True)
class StepLayout:
    world: int
    max_batch: int

    @property
    def size(self) -> int:
        return self.world + 2 * self.max_batch + self.world * self.max_batch + self.world + 1  # the last: pace

    def encode(
        self,
        rank: int,
        received: int,
        cancel_votes: Sequence[bool],
        tokens: Sequence[int],
        cached: Sequence[Proposal] = (),
        decode_share: int = 0,
        kv_capacity: int = MAX_CAPACITY_TOKENS,
    ) -> list[int]:
        """`cached`: this rank's proposal per pending assignment: the prompt tokens its prefix cache
        serves, None where it cannot run it, PREPARING while it prepares it.
        `decode_share`: rank 0's pace (the other ranks' is not written). `kv_capacity`: this rank's."""
        if max(len(cancel_votes), len(tokens), len(cached)) > self.max_batch:
            raise ValueError(f"more than max_batch={self.max_batch} slots in one step")
        vector = [0] * self.size
        vector[rank] = received
        base = self.world
        for slot, vote in enumerate(cancel_votes):
            vector[base + slot] = int(vote)
        base += self.max_batch
        for slot, token in enumerate(tokens):
            vector[base + slot] = token
        base += self.max_batch + rank * self.max_batch
        for index, proposal in enumerate(cached):
            vector[base + index] = _proposal_code(proposal)
        vector[self._capacities.start + rank] = min(max(0, kv_capacity), MAX_CAPACITY_TOKENS)
        if rank == 0:
            vector[-1] = max(0, decode_share)
        return vector

    @property
    def _capacities(self) -> slice:
        start = self.world + 2 * self.max_batch + self.world * self.max_batch
        return slice(start, start + self.world)

    def token_slots(self, rows: int) -> slice:
        """Where the vector holds the first `rows` slots' tokens (the decoding rows' are first)."""
        start = self.world + self.max_batch
        return slice(start, start + min(rows, self.max_batch))

    def decode(self, summed: Sequence[int], slots: int | None = None, pending: int | None = None) -> AgreedStep:
        """`slots`, `pending`: how many slots and pending assignments this step filled (None: all
        `max_batch`); the agreed tuples hold just those, so a step's bookkeeping costs what the
        batch holds, not `max_batch` (a batch of one runs it at every token)."""
        if len(summed) != self.size:
            raise ValueError(f"agreed vector has {len(summed)} entries, expected {self.size}")
        world, width = self.world, self.max_batch
        slots = width if slots is None else min(slots, width)
        pending = width if pending is None else min(pending, width)
        proposals = world + 2 * width
        per_rank = [summed[proposals + r * width : proposals + r * width + pending] for r in range(world)]
        columns = list(zip(*per_rank, strict=True))
        return AgreedStep(
            received=min(summed[:world]),
            cancelled=tuple(v > 0 for v in summed[world : world + slots]),
            tokens=tuple(summed[self.token_slots(slots)]),
            cached=tuple(max(0, agreed_prefix(column) - 2) for column in columns),
            runnable=tuple(min(column) > 0 for column in columns),
            prepared=tuple(_PREPARING_CODE not in column for column in columns),
            decode_share=summed[-1],
            kv_capacity=min(summed[self._capacities]),
        )


_PREPARING_CODE = 1


def _proposal_code(proposal: Proposal) -> int:
    if proposal is None:
        return 0
    if proposal == PREPARING:
        return _PREPARING_CODE
    return max(0, proposal) + 2


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
    left; `join_room`: how many of them the decoding rows take now (`MicroBatches.join_room`);
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


def delivery_interval(rows: int, events_per_round: int) -> int:
    """Every how many of its tokens a decoding stream's tokens go out as a chunk, with `rows` streams
    decoding (in every micro-batch). Each chunk is an event through the log, the API and the
    client's stream, about the same cost whatever it carries, and on a small machine that cost is
    taken from the batch's own forward: so a batch publishes about `events_per_round`
    (`batch_chunk_events_per_round`) chunks per round of tokens (one for each stream), not one per
    token (16 rows, 4 per round: each stream's tokens every 4 tokens), whatever the number of ranks.
    A few rows deliver every token; a first token always goes out at once (`delivers`)."""
    return max(1, rows // events_per_round)


def delivers(
    decode_step: int, rows: int, events_per_round: int, since_last_s: float = 0.0, min_interval_s: float = 0.0
) -> bool:
    """Whether a stream's token of `decode_step` goes out now (with those held since its last):
    its first token at once; later ones on the round's rhythm (`delivery_interval`), once
    `min_interval_s` (`stream_chunk_min_interval_seconds`) has passed since its last delivery, so a
    stream decoding faster than that sends its tokens a few at a time. Only the sampling rank
    delivers, so the clock read here decides nothing any other rank does."""
    if decode_step == 0:
        return True
    return decode_step % delivery_interval(rows, events_per_round) == 0 and since_last_s >= min_interval_s
