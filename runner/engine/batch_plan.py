"""A batch step's agreed vector, pure: what every rank writes into the step's one all-reduce, and what
the sum says (`AgreedStep`); and when a stream's tokens go out.

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
(`AgreedStep.prepared`) while those after it in the log may join past it (`step_plan.ready_to_admit`). Each
rank writes its KV capacity in tokens of its own layers (`kv_budget.token_capacity`) in its own
entry; the batch admits within the least (`AgreedStep.kv_capacity`). Cancel votes add up (any rank's vote
stops that stream); the sampling rank alone writes the tokens, and rank 0 alone the pace: what its
decode steps cost against a prompt chunk, measured on its clock (`pace.StepPace`), which sizes the
chunks of the newcomers admitted at this step. What the agreed vector decides is
`step_plan.plan_step`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from runner.engine.kv_budget import MAX_CAPACITY_TOKENS
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


def delivery_interval(rows: int, events_per_round: int) -> int:
    """Every how many of its tokens a decoding stream's tokens go out as a chunk, with `rows` streams
    decoding (in every micro-batch). Each chunk is an event through the log, the API and the
    client's stream, about the same cost whatever it carries, and on a small machine that cost is
    taken from the batch's own forward: so a batch publishes about `events_per_round`
    (`batch_chunk_events_per_round`) chunks per round of tokens (one for each stream), not one per
    token (16 rows, 4 per round: each stream's tokens every 4 tokens), whatever the number of ranks.
    A few rows deliver every token; a first text always goes out at once (`delivers`)."""
    return max(1, rows // events_per_round)


def delivers(
    decode_step: int,
    rows: int,
    events_per_round: int,
    since_last_s: float = 0.0,
    min_interval_s: float = 0.0,
    *,
    text_shown: bool,
) -> bool:
    """Whether a stream's token of `decode_step` goes out now (with those held since its last):
    every token at once until the stream has shown text (`text_shown`: its first token, and the
    ones after it while they make no text a reader sees yet: the first bytes of a character split
    over tokens, the possible start of a stop string), so its first text is never held for the
    round; later ones on the round's rhythm (`delivery_interval`), once `min_interval_s`
    (`stream_chunk_min_interval_seconds`) has passed since its last delivery, so a stream decoding
    faster than that sends its tokens a few at a time. Only the sampling rank delivers, so what is
    read here (the clock, the text shown) decides nothing any other rank does."""
    if not text_shown:
        return True
    return decode_step % delivery_interval(rows, events_per_round) == 0 and since_last_s >= min_interval_s
