"""One batch step as data (`runner/engine/step_plan.py`): tables of what a step computes and what its
agreement decides, and properties over random runs of many steps on 1-3 ranks: every rank plans
alike from the agreed vector, a leaving row is never scheduled again, each prompt's chunks are
taken once each, in order, before it joins, and a micro-batch a rank sends on is the one the next
rank computes at the next step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.engine.batch_plan import PREPARING, AgreedStep, Proposal, StepLayout
from runner.engine.choices import WAITING_FOR_LEADER, choice_rows, task_of
from runner.engine.kv_budget import MAX_CAPACITY_TOKENS
from runner.engine.plan import chunk_sizes, prefill_cost
from runner.engine.step_plan import (
    UNRUNNABLE_ELSEWHERE,
    Admit,
    BatchState,
    MicroLayout,
    Pending,
    Refuse,
    StepPlan,
    Waiting,
    plan_step,
    plan_work,
)

pytestmark = pytest.mark.timeout(120)

STEP = 8  # prefill_step_size: small, so short prompts take several chunks
CHOICES_ERROR = "n > 1 is not supported for this model"


def agreed(
    received: int = 0,
    cancelled: tuple[bool, ...] = (),
    tokens: tuple[int, ...] = (),
    cached: tuple[int, ...] = (),
    runnable: tuple[bool, ...] | None = None,
    decode_share: int = 0,
    kv_capacity: int = MAX_CAPACITY_TOKENS,
) -> AgreedStep:
    return AgreedStep(
        received,
        cancelled,
        tokens,
        cached,
        (True,) * len(cached) if runnable is None else runnable,
        (True,) * len(cached),
        decode_share,
        kv_capacity,
    )


def state(
    parts: tuple[tuple[str, ...], ...] = ((),),
    iteration: int | None = None,
    prefilling: tuple[Waiting, ...] = (),
    admitted: int = 0,
    world: int = 1,
    max_batch: int = 4,
    **others: object,
) -> BatchState:
    reserved = {row: 10 for part in parts for row in part} | {w.row: 10 for w in prefilling}
    base = BatchState(
        world=world,
        max_batch=max_batch,
        step=5,
        micro=MicroLayout(world, parts, iteration),
        prefilling=prefilling,
        admitted=admitted,
        reserved=reserved,
        prefill_step_size=STEP,
        prefill_budget=prefill_cost(STEP * world, 0, None),
    )
    return replace(base, **others)  # pyright: ignore[reportArgumentType]


def chunk(row: str, left: int = 1, cost: float | None = 1.0, **others: object) -> Waiting:
    return Waiting(row, chunks_left=left, next_chunk_cost=cost if left else None, **others)  # pyright: ignore[reportArgumentType]


# --- what a step computes before its agreement -------------------------------------------------


@pytest.mark.parametrize(
    ("case", "batch", "takers", "pipeline", "joining", "sole"),
    [
        ("an empty batch computes nothing", state(), (), False, False, True),
        ("the rows alone, in lockstep", state(parts=(("a",),)), (), False, False, True),
        (
            "the first with a chunk takes it, a later one too while the budget holds",
            state(prefilling=(chunk("b", 0), chunk("c", 2, 3.0), chunk("d", 3, 1.0), chunk("e", 2, 1e9))),
            ("c", "d"),
            False,
            True,  # b is prefilled: it may join at the end of this step
            False,
        ),
        (
            "a stream that takes its last chunk may join at the end of the step",
            state(parts=(("a",),), prefilling=(chunk("b", 1),)),
            ("b",),
            False,
            True,
            False,
        ),
        (
            "a lone prompt on the pipeline takes its whole prefill, alone",
            state(world=2, parts=((), ()), prefilling=(Waiting("b", "pipeline", 4, 1.0),)),
            ("b",),
            True,
            True,
            False,
        ),
        (
            "the step after a join",
            state(parts=(("a", "b"),), last_join_step=4),
            (),
            False,
            True,
            True,
        ),
        (
            "a chunk still on its way through the ranks keeps every rank to its share",
            state(world=2, parts=(("a",), ()), chunks_in_flight=True),
            (),
            False,
            False,
            False,
        ),
    ],
)
def test_plan_work(
    case: str, batch: BatchState, takers: tuple[str, ...], pipeline: bool, joining: bool, sole: bool
) -> None:
    work = plan_work(batch)
    assert (work.takers, work.pipeline, work.joining, work.sole) == (takers, pipeline, joining, sole), case


# --- what the agreement decides ----------------------------------------------------------------


def test_an_idle_batch_admits_in_log_order_each_with_its_chunks() -> None:
    pending = [Pending("a", prompt_len=20), Pending("b", prompt_len=5), Pending("c", prompt_len=9)]
    plan = plan_step(state(), agreed(2, cached=(0, 0, 0)), frozenset(), pending)
    assert plan.transition.newcomers == ("a", "b")  # only two read by every rank
    assert plan.admissions == (
        Admit("a", 0, 0, "sequential", tuple(chunk_sizes(20, STEP))),
        Admit("b", 1, 0, "sequential", (4,)),
    )
    assert plan.composition.prefilling == ("a", "b") and plan.composition.admitted == 2
    assert plan.micro.rows == () and plan.micro.lockstep


def test_a_lone_long_prompt_on_several_ranks_takes_the_pipeline_and_a_cached_one_does_not() -> None:
    batch = state(world=2, parts=((), ()))
    alone = plan_step(batch, agreed(1, cached=(0,)), frozenset(), [Pending("a", prompt_len=30)])
    assert alone.admissions == (Admit("a", 0, 0, "pipeline", tuple(chunk_sizes(30, STEP // 2))),)
    cached = plan_step(batch, agreed(1, cached=(12,)), frozenset(), [Pending("a", prompt_len=30)])
    (admit,) = cached.admissions
    assert isinstance(admit, Admit) and admit.path == "sequential" and admit.cached == 12
    assert sum(admit.chunks) == 30 - 1 - 12  # the rest of the prompt, its last token left to decode


def test_a_newcomer_beside_rows_leaves_room_for_their_decode() -> None:
    """The agreed pace (rank 0's) shrinks a newcomer's chunks when rows decode; alone it has a whole chunk."""
    pending = [Pending("b", prompt_len=40)]
    beside = plan_step(
        state(parts=(("a",),), admitted=1), agreed(2, cached=(0,), decode_share=500), frozenset(), pending
    )
    (admit,) = beside.admissions
    assert isinstance(admit, Admit) and max(admit.chunks) == STEP // 2
    alone = plan_step(state(admitted=1), agreed(2, cached=(0,), decode_share=500), frozenset(), pending)
    (admit,) = alone.admissions
    assert isinstance(admit, Admit) and max(admit.chunks) == STEP


@pytest.mark.parametrize(
    ("case", "pending", "step", "verdict"),
    [
        (
            "this rank could not build it",
            Pending("a", built=False, error="TaskCreated not found"),
            agreed(1, cached=(0,), runnable=(False,)),
            Refuse("a", 0, "TaskCreated not found", invalid_request=False),
        ),
        (
            "another rank could not build it",
            Pending("a"),
            agreed(1, cached=(0,), runnable=(False,)),
            Refuse("a", 0, UNRUNNABLE_ELSEWHERE, invalid_request=False),
        ),
        (
            "wider than the batch",
            Pending("a", n=5),
            agreed(1, cached=(0,)),
            Refuse("a", 0, "n=5 completions need as many rows of the batch, over this instance's max_batch=4", True),
        ),
        (
            "its preparation refused it (the request's checks, its grammar)",
            Pending("a", invalid="max_tokens must be > 0, got 0"),
            agreed(1, cached=(0,)),
            Refuse("a", 0, "max_tokens must be > 0, got 0", invalid_request=True),
        ),
        (
            "its preparation's verdict comes after a rank's failure to build it",
            Pending("a", invalid="bad grammar"),
            agreed(1, cached=(0,), runnable=(False,)),
            Refuse("a", 0, UNRUNNABLE_ELSEWHERE, invalid_request=False),
        ),
        (
            "several choices on a model whose caches cannot hand the prompt on",
            Pending("a", n=2),
            agreed(1, cached=(0,)),
            Refuse("a", 0, CHOICES_ERROR, invalid_request=True),
        ),
    ],
)
def test_a_newcomer_that_cannot_run_fails_alone(case: str, pending: Pending, step: AgreedStep, verdict: Refuse) -> None:
    plan = plan_step(replace(state(), choices_error=CHOICES_ERROR), step, frozenset(), [pending])
    assert plan.admissions == (verdict,), case
    assert plan.transition.newcomers == ("a",) and plan.composition.prefilling == (), "it never takes a step"
    assert plan.composition.admitted == 1


def test_a_model_that_cannot_hand_a_prompt_on_still_runs_one_choice() -> None:
    plan = plan_step(replace(state(), choices_error=CHOICES_ERROR), agreed(1, cached=(0,)), frozenset(), [Pending("a")])
    assert plan.admissions == (Admit("a", 0, 0, "sequential", (1,)),)  # its prompt of 2: one chunk of 1
    assert plan.composition.prefilling == ("a",)


def test_a_request_larger_than_the_kv_capacity_fails_and_never_blocks_the_queue() -> None:
    pending = [Pending("big", reserved=500), Pending("small", reserved=10)]
    plan = plan_step(state(), agreed(2, cached=(0, 0), kv_capacity=100), frozenset(), pending)
    big, small = plan.admissions
    assert isinstance(big, Refuse) and big.invalid_request and "KV cache for 500 tokens" in big.error
    assert isinstance(small, Admit)


def test_cancelled_and_stopped_rows_leave_the_boundary_and_the_kept_rows_say_which_stay() -> None:
    batch = state(parts=(("a", "b", "c"),), admitted=3)
    plan = plan_step(batch, agreed(3, cancelled=(False, True, False)), frozenset({"c"}), [])
    assert plan.transition.cancelled == ("b",) and plan.transition.finished == ("c",)
    assert plan.transition.kept_rows == (0,) and plan.micro.parts == (("a",),)


def test_a_prefilled_stream_starts_the_ring_on_two_ranks_and_the_last_row_ends_it() -> None:
    batch = state(world=2, parts=(("a",), ()), prefilling=(chunk("b", 0, landed=True),), admitted=2)
    plan = plan_step(batch, agreed(2, cancelled=(False, False)), frozenset(), [])
    assert plan.transition.joined == ("b",) and plan.join_target == 1
    assert plan.micro.parts == (("a",), ("b",)) and plan.micro.iteration == 0  # the ring starts
    # later: "a" leaves at its boundary while "b" is on its way; then "b" alone goes back to lockstep
    ring = state(world=2, parts=(("a",), ("b",)), iteration=1, admitted=2)  # the boundary: "a"
    gone = plan_step(ring, agreed(2, cancelled=(True,)), frozenset(), [])
    assert gone.micro.parts == ((), ("b",)) and gone.micro.iteration == 2
    back = plan_step(replace(ring, micro=gone.micro), agreed(2, cancelled=(False,)), frozenset(), [])
    assert back.micro.lockstep and back.micro.parts == (("b",), ()) and back.order == (1, 0)


def test_followers_are_handed_their_leaders_prompt_the_step_it_lands_and_join_with_it() -> None:
    leader = chunk("t", 0, landed=True)
    followers = tuple(Waiting(row, leader="t", awaiting_leader=True) for row in choice_rows("t", 3)[1:])
    batch = state(prefilling=(leader, *followers), admitted=1)
    plan = plan_step(batch, agreed(1, cancelled=(False,) * 3), frozenset(), [])
    assert plan.handed == ("t#1", "t#2")
    assert plan.micro.parts == (("t", "t#1", "t#2"),)
    waiting = plan_step(replace(batch, prefilling=(chunk("t", 1), *followers)), agreed(1), frozenset(), [])
    assert waiting.handed == () and waiting.micro.rows == ()


def test_a_task_of_several_choices_one_rank_could_not_read_takes_one_row_on_every_rank() -> None:
    """The rank without its request cannot know its `n`: counted as 3 rows elsewhere, it let the
    next assignment in on that rank alone, and the ranks' batches parted (found by the random runs)."""
    step = agreed(2, cached=(0, 0), runnable=(False, True))
    read = plan_step(state(max_batch=3), step, frozenset(), [Pending("wide", n=3), Pending("b")])
    unread = plan_step(state(max_batch=3), step, frozenset(), [Pending("wide", built=False), Pending("b")])
    assert read.transition == unread.transition and read.transition.newcomers == ("wide", "b")


def test_a_rank_that_read_more_assignments_plans_what_its_peers_plan() -> None:
    """Ranks agree on the least count: the assignments one rank read past it change nothing."""
    step = agreed(1, cached=(0, 0, 0))
    plans = [
        plan_step(
            state(), replace(step, cached=step.cached[: len(p)], runnable=step.runnable[: len(p)]), frozenset(), p
        )
        for p in ([Pending("a")], [Pending("a"), Pending("b")], [Pending("a"), Pending("b"), Pending("c")])
    ]
    assert plans[0] == plans[1] == plans[2]


# --- properties over random runs ---------------------------------------------------------------


@dataclass
class SimStream:
    """What the executor's `Stream` holds that the plans read (no MLX, no tokens)."""

    prompt_len: int
    path: str = "sequential"
    chunks: tuple[int, ...] = ()
    next_chunk: int = 0
    cached: int = 0
    lands_at: int = -1
    leader: str | None = None
    takes: list[int] = field(default_factory=list)  # the chunk index taken at each take, in order


@dataclass
class Assignment:
    task_id: str
    prompt_len: int
    n: int
    reserved: int
    unbuilt_on: int | None  # a rank that could not build its request
    preparing_until: int  # the step before which one rank still prepares it
    invalid: bool = False  # its preparation refuses it (a bad request: the same verdict on every rank)


class Sim:
    """The executor's bookkeeping around the two plans, every rank's at once: each step, the work
    `plan_work` names, then the agreement summed from every rank's own vector (each rank may have
    read more of the log than the others), then every rank's `plan_step`, which must all agree."""

    def __init__(self, world: int, max_batch: int) -> None:
        self.world, self.max_batch = world, max_batch
        self.layout = StepLayout(world, max_batch)
        self.micro = MicroLayout(world, tuple(() for _ in range(world)))
        self.streams: dict[str, SimStream] = {}
        self.prefilling: tuple[str, ...] = ()
        self.admitted: set[str] = set()
        self.log: list[Assignment] = []
        self.read = [0] * world  # how much of the log each rank has read
        self.groups: list[int] = []  # steps at which chunk groups were taken, still in flight
        self.step = 0
        self.last_join: int | None = None
        self.gone: set[str] = set()

    def state(self) -> BatchState:
        waiting = []
        for row in self.prefilling:
            s = self.streams[row]
            left = len(s.chunks) - s.next_chunk
            done = sum(s.chunks[: s.next_chunk]) + s.cached
            waiting.append(
                Waiting(
                    row,
                    "pipeline" if s.path == "pipeline" else "sequential",
                    left,
                    prefill_cost(s.chunks[s.next_chunk], done, None) if left else None,
                    landed=left == 0 and s.lands_at <= self.step,
                    leader=s.leader,
                    awaiting_leader=s.lands_at == WAITING_FOR_LEADER,
                )
            )
        return BatchState(
            world=self.world,
            max_batch=self.max_batch,
            step=self.step,
            micro=self.micro,
            prefilling=tuple(waiting),
            admitted=len(self.admitted),
            reserved={row: 30 for row in self.streams},
            chunks_in_flight=bool(self.groups),
            last_join_step=self.last_join,
            prefill_step_size=STEP,
            prefill_budget=prefill_cost(STEP * self.world, 0, None),
        )

    def pending(self, rank: int) -> list[Assignment]:
        return [a for a in self.log[: self.read[rank]] if a.task_id not in self.admitted]

    def run_step(self, data: st.DataObject) -> None:
        work = plan_work(self.state())
        first = next((row for row in self.prefilling if self._left(row)), None)
        assert work.takers[:1] == ((first,) if first else ()), "the first stream with a chunk always takes it"
        for row in work.takers:
            stream = self.streams[row]
            assert row not in self.gone and self._left(row) > 0
            if work.pipeline:
                stream.takes.extend(range(stream.next_chunk, len(stream.chunks)))
                stream.next_chunk = len(stream.chunks)
            else:
                stream.takes.append(stream.next_chunk)
                stream.next_chunk += 1
                stream.lands_at = self.step + self.world - 1
        if work.takers and not work.pipeline:
            self.groups.append(self.step)

        # the agreement: every rank's own vector, summed
        members = self.state().current.members
        rarely = st.sampled_from((False,) * 7 + (True,))  # streams live long enough to join and ride the ring
        cancel = data.draw(st.lists(rarely, min_size=len(members), max_size=len(members)))
        for rank in range(self.world):
            self.read[rank] = data.draw(st.integers(self.read[rank], len(self.log)))
        pendings = [self.pending(rank) for rank in range(self.world)]
        vectors = []
        for rank, pending in enumerate(pendings):
            proposals: list[Proposal] = [self._proposal(a, rank, data) for a in pending[: self.max_batch]]
            votes = cancel if rank == 0 else [False] * len(members)
            received = len(self.admitted) + len(pending)
            vectors.append(self.layout.encode(rank, received, votes, [7] * len(members), proposals, 0, 10_000))
        summed = [sum(column) for column in zip(*vectors, strict=True)]
        self.groups = [taken for taken in self.groups if taken + self.world - 1 > self.step]  # retired

        boundary = self.micro.boundary_rows()
        stopped = frozenset(row for row in boundary if data.draw(rarely))
        state = self.state()
        plans = []
        for rank, pending in enumerate(pendings):
            step = self.layout.decode(summed, len(members), len(pending))
            plans.append(plan_step(state, step, stopped, [self._pending(a, rank) for a in pending]))
        assert all(_same(plans[0], plan) for plan in plans), "every rank plans alike from the agreed vector"
        self._apply(plans[0])

    def _apply(self, plan: StepPlan) -> None:
        transition = plan.transition
        leaving = set(transition.cancelled) | set(transition.finished)
        for row in plan.handed:
            self.streams[row].lands_at = self.step
        for row in transition.joined:
            stream = self.streams[row]
            assert stream.lands_at <= self.step, "a stream joins once its chunks passed every rank"
            if stream.leader is None:  # its prompt's chunks, taken once each, in order, all of them
                assert stream.takes == list(range(len(stream.chunks)))
                assert stream.cached + sum(stream.chunks) == stream.prompt_len - 1
        for row in leaving:
            del self.streams[row]
        self.gone |= leaving
        refused = set()
        for verdict in plan.admissions:
            self.admitted.add(verdict.task_id)
            if isinstance(verdict, Refuse):
                refused.add(verdict.task_id)
                continue
            n = next(a.n for a in self.log if a.task_id == verdict.task_id)
            prompt_len = next(a.prompt_len for a in self.log if a.task_id == verdict.task_id)
            self.streams[verdict.task_id] = SimStream(prompt_len, verdict.path, verdict.chunks, cached=verdict.cached)
            for row in choice_rows(verdict.task_id, n)[1:]:
                self.streams[row] = SimStream(prompt_len, leader=verdict.task_id, lands_at=WAITING_FOR_LEADER)
        self.prefilling = plan.composition.prefilling
        assert not refused & {task_of(row) for row in self.prefilling}, "a refused newcomer never takes a step"
        scheduled = set(plan.micro.rows) | set(self.prefilling)
        assert not leaving & scheduled, "a leaving row is never scheduled again"
        assert scheduled == set(self.streams), "every stream is either decoding or waiting"
        assert len(plan.micro.rows) + len(self.prefilling) <= self.max_batch
        self._check_sends(plan)
        if transition.joined:
            self.last_join = self.step
        self.micro = plan.micro
        self.step += 1
        assert not (set(plan_work(self.state()).takers) & self.gone)

    def _check_sends(self, plan: StepPlan) -> None:
        """On the ring, what rank r computed at this step (and sends after its agreement) is what
        rank r+1 computes at the next one: every send has its receive, in the order sent."""
        if self.micro.lockstep:
            return
        for rank in range(self.world - 1):
            part = self.micro.working(rank)
            if part is None or not self.micro.parts[part]:
                continue
            receiver = plan.micro.working(rank + 1)
            assert receiver is not None, "the ring keeps going while a micro-batch is mid-ring"
            assert plan.order[receiver] == part

    def _left(self, row: str) -> int:
        stream = self.streams[row]
        return len(stream.chunks) - stream.next_chunk

    def _proposal(self, assignment: Assignment, rank: int, data: st.DataObject) -> Proposal:
        if assignment.unbuilt_on == rank:
            return None
        if rank == 0 and self.step < assignment.preparing_until:
            return PREPARING
        return data.draw(st.integers(0, assignment.prompt_len - 1))

    def _pending(self, assignment: Assignment, rank: int) -> Pending:
        if assignment.unbuilt_on == rank:
            return Pending(assignment.task_id, built=False, error="not read")
        return Pending(
            assignment.task_id,
            n=assignment.n,
            prompt_len=assignment.prompt_len,
            reserved=assignment.reserved,
            invalid="refused by its preparation" if assignment.invalid else None,
        )


def _same(one: StepPlan, other: StepPlan) -> bool:
    """Equal but for the message of a request some rank could not build (each rank says why it failed)."""

    def unmessaged(verdicts: Sequence[Admit | Refuse]) -> tuple[Admit | Refuse, ...]:
        return tuple(replace(v, error="") if isinstance(v, Refuse) and not v.invalid_request else v for v in verdicts)

    return replace(one, admissions=unmessaged(one.admissions)) == replace(
        other, admissions=unmessaged(other.admissions)
    )


assignments = st.builds(
    Assignment,
    task_id=st.just(""),
    prompt_len=st.integers(2, 40),
    n=st.sampled_from((1, 1, 1, 2, 3)),
    reserved=st.sampled_from((30, 30, 30, 20_000)),
    unbuilt_on=st.one_of(st.none(), st.none(), st.none(), st.integers(0, 2)),
    preparing_until=st.sampled_from((0, 0, 0, 3)),
    invalid=st.sampled_from((False, False, False, True)),
)


@settings(max_examples=60)
@given(world=st.integers(1, 3), max_batch=st.integers(1, 5), data=st.data())
def test_random_runs_keep_every_rank_in_step(world: int, max_batch: int, data: st.DataObject) -> None:
    sim = Sim(world, max_batch)
    for _ in range(data.draw(st.integers(1, 40))):
        for assignment in data.draw(st.lists(assignments, max_size=2)):
            sim.log.append(replace(assignment, task_id=f"t{len(sim.log)}"))
        sim.run_step(data)


@given(
    world=st.integers(1, 3),
    prompt_len=st.integers(1, 200),
    cached_share=st.floats(0, 1),
    beside_rows=st.booleans(),
    decode_share=st.integers(0, 1000),
)
def test_a_newcomers_chunks_cover_its_prompt_once_past_the_cached_prefix(
    world: int, prompt_len: int, cached_share: float, beside_rows: bool, decode_share: int
) -> None:
    """Whatever its path and the agreed pace: the cached prefix, then chunks of at least one token
    that end at the prompt's last token but one (which the first decode step runs)."""
    cached = int(cached_share * max(0, prompt_len - 1))
    batch = state(world=world, parts=((("a",),) + ((),) * (world - 1)) if beside_rows else ((),) * world, admitted=1)
    step = agreed(2, cached=(cached,), decode_share=decode_share)
    (verdict,) = plan_step(batch, step, frozenset(), [Pending("b", prompt_len=prompt_len)]).admissions
    assert isinstance(verdict, Admit) and verdict.cached == cached
    assert all(size >= 1 for size in verdict.chunks)
    assert cached + sum(verdict.chunks) == max(0, prompt_len - 1)
    assert verdict.path == "sequential" or (world > 1 and not beside_rows and cached == 0)
