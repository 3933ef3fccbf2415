"""Continuous batching on one rank: the executor of a step planned as data (`step_plan.py`).

A step on every rank, `ContinuousBatch.step`: `plan_work` on the batch as every rank holds it
(`state`) names the work, which this runs: the prompt chunks taken (pipelined through the ranks:
`batch_chunks`, rank r computes a group r steps after it was taken; first chunks of one length in
one forward: `batch_prefill`), or a lone prompt's whole overlapped prefill on the GPipe schedule;
then this rank's micro-batch of decoding rows ([B, 1], one token: `batch_rows.RowDecoder`, on the
ring of `micro_batches`). Then the step's one all-reduce (`batch_plan.StepLayout`: the boundary
micro-batch's tokens, the cancel votes, the assignments every rank holds, the newcomers' prefix
proposals, the KV capacities, rank 0's pace), the sends' flush (the next rank computes this step's
activations at the next step), and the agreed tokens through each row's stop rules. `plan_step`
derives everything else from that vector, and this applies it: the rows that leave copied into
the prefix cache (`prefix_cache`) and dropped from their micro-batch's cache, the followers of a
task of several choices handed their leader's prompt KV (`choices.py`), the prefilled streams
joined into the boundary micro-batch's cache (`batch_cache`), the newcomers' streams built with
the chunks and the cached prefix the plan gives them, or ended alone. So every rank runs the same
forwards and the same collective at every step (docs/ARCHITECTURE.md §6); every decision is in
the planner, and nothing here decides what another rank must do alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import msgspec
from mlx_lm.models.cache import make_prompt_cache

from events.vocabulary import FinishReason
from runner.engine.batch_cache import BatchShardCache, join_room, prefix_caches
from runner.engine.batch_chunks import PipelinedChunks
from runner.engine.batch_plan import AgreedStep, StepLayout, delivers
from runner.engine.batch_rows import RowDecoder
from runner.engine.batch_streams import Admission, Ended, StepResult, Stream, merged
from runner.engine.choices import WAITING_FOR_LEADER, ChoiceSink, choice_seed, hands_prompt, task_of
from runner.engine.decode import Emitter
from runner.engine.engine import Engine
from runner.engine.kv_budget import batch_need
from runner.engine.logprobs import LazyLogprobs
from runner.engine.micro_batches import MicroBatch, MicroBatches
from runner.engine.pace import StepPace
from runner.engine.plan import effective_step, prefill_cost, rank_schedule
from runner.engine.prefill import run_pipeline_prefill
from runner.engine.prefix_cache import PrefixIndex
from runner.engine.preparation import Newcomers, Prepared, PrepareInline
from runner.engine.protocols import PhaseTracker, Preparer
from runner.engine.shared_cores import SharedCores
from runner.engine.step_plan import (
    Admit,
    BatchState,
    Composition,
    Pending,
    Refuse,
    StepPlan,
    StepWork,
    Waiting,
    plan_step,
    plan_work,
)


class ContinuousBatch:
    """One rank's running batch. Every rank calls `step` at the same points: whenever the batch is
    `busy` (agreed), and otherwise once it holds an admission not yet admitted (every rank will)."""

    def __init__(
        self,
        engine: Engine,
        phases: PhaseTracker,
        max_batch: int,
        prefix_cache_bytes: int | None = None,
        preparer: Preparer | None = None,
        cores: SharedCores | None = None,
        pace: StepPace | None = None,
    ) -> None:
        """`prefix_cache_bytes`: None takes the instance's setting (tests give ranks different bounds).
        `preparer`: who prepares newcomers (`preparation.py`; None: at once, on the step loop).
        `cores`: the agreed decode mode and this rank's BLAS threads (`shared_cores.py`; None: the ring).
        `pace`: what its steps teach and its newcomers' chunks are sized by (None: the engine's, which
        the served batch learns; a batch of one takes its own: `alone.py`)."""
        self.engine, self.phases = engine, phases
        self.pace = engine.pace if pace is None else pace
        self.max_batch = max_batch
        self.layout = StepLayout(engine.collectives.world, max_batch)
        world = engine.collectives.world
        step = effective_step(engine.settings.prefill_step_size, world)
        # What `world` fresh first chunks cost: a chunk group is pipelined (`batch_chunks`), so each
        # rank computes only its own layers of it, about what one chunk costs a rank alone.
        self.prefill_budget = prefill_cost(step * world, 0, engine.prefill_keys_per_token)
        self._agreed_at: float | None = None  # this rank's clock at the last step's agreement
        self.kv_capacity = engine.kv_capacity  # this rank's; the batch admits within the least (`kv_budget`)
        self.composition = Composition()  # the admitted streams not decoding yet (its rows are in `micro`)
        self.streams: dict[str, Stream] = {}
        self.cores = cores or SharedCores()
        self.micro = MicroBatches(engine.collectives.world, ring=not self.cores.lockstep)
        self.row_decoder = RowDecoder(engine)
        self.last_join_step: int | None = None  # the step at whose end a stream last joined the rows
        self.chunks = PipelinedChunks(engine.rank, engine.collectives.world)
        self.steps = 0
        bound = engine.settings.prefix_cache_bytes if prefix_cache_bytes is None else prefix_cache_bytes
        self.prefixes: PrefixIndex[list[Any]] = PrefixIndex(bound)
        self.newcomers = Newcomers(self.prefixes, preparer or PrepareInline(engine.prepare))
        self.choices_ended: dict[str, dict[int, Ended]] = {}  # a task of several choices: its rows gone so far
        # every layer's cache kind (not only this rank's): the same verdict on every rank
        self.choices_error = hands_prompt(make_prompt_cache(engine.shard.model))

    @property
    def busy(self) -> bool:
        """Members, or chunks of streams already gone (cancelled) still on their way through the ranks."""
        return bool(self.members) or self.chunks.busy()

    @property
    def members(self) -> tuple[str, ...]:
        """The tasks in the batch, each once (a task of several choices holds several rows)."""
        return tuple(dict.fromkeys(task_of(row) for row in self.micro.rows + self.composition.prefilling))

    def step(self, read_pending: Callable[[], Sequence[Admission]]) -> StepResult:
        """One step. `read_pending()`: this rank's assignments read and not yet admitted, in log
        order; called once, after this rank's forward, so an assignment read while it ran is
        counted in this step's agreement (the agreement admits what every rank holds: the least
        count), not the next one's: a step sooner to its first token."""
        try:
            return self._step(read_pending)
        except BaseException:
            self.engine.shard.outbox.abandon()  # never wait on a peer that may be gone
            self.row_decoder.abandon()
            raise

    def _step(self, read_pending: Callable[[], Sequence[Admission]]) -> StepResult:
        """The work `plan_work` names, the agreement, then what `plan_step` derives from it. The
        slots of the agreement are the boundary micro-batch's rows, then the prefilling streams
        (`batch_plan.StepLayout`); the other rows are mid-ring."""
        members = self.members
        state = self.state()
        current = state.current
        work = plan_work(state)
        self.phases.enter("decode", members[0] if members else None, self.steps)
        self.cores.before_step(work.sole)
        # the chunks before the rows: a chunk sent after the last agreement is read first
        chunked, chunk_cost = self._prefill_chunks(work)
        working = self.micro.working(self.engine.rank)
        tokens, logprobs = self._decode_rows(working, work)  # the boundary's, on the sampling rank; none elsewhere
        logprobs = logprobs or [None] * len(current.rows)
        asked: dict[str, bool] = {}  # by task: a task's choices vote alike (one read of its cancel)
        votes = [self._vote(self.streams[t], asked) for t in current.members]
        self.phases.enter("agree_cancel", members[0] if members else None, self.steps)
        pending = read_pending()
        received = current.admitted + len(pending)
        share = self.pace.decode_share()
        proposals = self.newcomers.propose(pending[: self.max_batch], idle=not members)
        vector = self.layout.encode(self.engine.rank, received, votes, tokens, proposals, share, self.kv_capacity)
        agreed = self.layout.decode(self._agree(vector), len(votes), len(pending))
        self._observe(chunk_cost, 0 if working is None else len(working.rows))
        outbox = self.engine.shard.outbox
        outbox.complete()  # received before the peer's vote we just agreed with
        outbox.flush()  # the next rank computes this micro-batch at the next step
        self.chunks.retire(self.steps)
        ended, plan = self._apply(current, agreed, logprobs, chunked, pending)
        self.steps += 1
        self.micro.follow(plan.micro, plan.order)
        self.row_decoder.settle(self.micro)
        members = self.members
        self.phases.enter("decode" if members else "idle", members[0] if members else None, self.steps)
        if not self.busy:
            self._agreed_at = None  # the next step's period would count the wait for an assignment
        return ended

    def state(self) -> BatchState:
        """The batch as the plans see it: what every rank holds alike (docs/ARCHITECTURE.md §6)."""
        engine, steps = self.engine, self.steps
        keys = engine.prefill_keys_per_token
        waiting = []
        for row in self.composition.prefilling:
            stream = self.streams[row]
            waiting.append(
                Waiting(
                    row,
                    stream.path,
                    stream.chunks_left,
                    stream.next_chunk_cost(keys),
                    landed=stream.landed(steps),
                    leader=stream.leader,
                    awaiting_leader=stream.lands_at == WAITING_FOR_LEADER,
                )
            )
        return BatchState(
            world=engine.collectives.world,
            max_batch=self.max_batch,
            step=steps,
            micro=self.micro.layout,
            prefilling=tuple(waiting),
            admitted=self.composition.admitted,
            reserved={row: stream.reserved for row, stream in self.streams.items()},
            chunks_in_flight=self.chunks.busy(),
            last_join_step=self.last_join_step,
            prefill_step_size=engine.settings.prefill_step_size,
            keys_per_token=keys,
            prefill_budget=self.prefill_budget,
            choices_error=self.choices_error,
        )

    def _observe(self, chunk_cost: float | None, rows: int) -> None:
        """This step's period on this rank's clock, from the previous step's agreement (only rank 0's
        pace is agreed: `pace.py`); none after an idle wait or a lone prompt's whole prefill."""
        now = time.perf_counter()
        if self._agreed_at is not None and chunk_cost is not None:
            self.pace.observe(now - self._agreed_at, rows, chunk_cost)
        self._agreed_at = now

    def _agree(self, vector: list[int]) -> list[int]:
        """The step's all-reduce; in lockstep rank 0 of several computes the rows' next step on its
        result meanwhile (`RowDecoder.speculate`; kept or taken back at `settle`), unless a row
        takes its last token now (`max_tokens`): that step would surely be taken back, and the
        rows that stay would wait behind it."""
        first, collectives = self.micro.parts[0], self.engine.collectives
        if not (self.micro.lockstep and first.rows and self.row_decoder.can_speculate(first)):
            return collectives.agree(vector)
        if any(self.streams[t].decode_step + 1 >= self.streams[t].spec.max_tokens for t in first.rows):
            return collectives.agree(vector)
        tokens = self.layout.token_slots(len(first.rows))  # the lockstep rows are the first slots
        return collectives.agree_ahead(vector, lambda total: self.row_decoder.speculate(first, total[tokens]))

    def _decode_rows(self, part: MicroBatch | None, work: StepWork) -> tuple[list[int], list[LazyLogprobs | None]]:
        """This rank's micro-batch of the step (`MicroBatches.working`): on the sampling rank, the boundary one."""
        if part is None or part.cache is None:
            return [], []
        rows = [self.streams[t] for t in part.rows]
        specs = [s.spec for s in rows]
        look_ahead = self.row_decoder.can_look_ahead(specs, work.joining)
        inputs = [s.next_input for s in rows]
        return self.row_decoder.step(inputs, specs, part.cache, look_ahead, send_now=self.micro.lockstep)

    def _prefill_chunks(self, work: StepWork) -> tuple[list[Stream], float | None]:
        """The streams that take a chunk at this step (`work.takers`), first chunks of one length in
        one forward (`batch_prefill`), pipelined through the ranks (`batch_chunks`: this rank
        computes the group taken `rank` steps ago); or, for a stream admitted alone on the pipeline
        path, its whole prefill (the GPipe schedule). With them, the cost of the chunks this rank
        computed (None for a whole prefill)."""
        takers = [self.streams[t] for t in work.takers]
        if work.pipeline:  # admitted alone: nothing else prefills with it
            self._pipeline_prefill(takers[0])
            return takers, None
        self.chunks.take(self.steps, takers, work.chunk_cost)
        return takers, self.chunks.compute(self.steps)

    def _pipeline_prefill(self, head: Stream) -> None:
        """Nothing else runs (agreed at admission): every rank overlaps the chunks on the GPipe
        schedule, agreeing on cancel at every iteration; newcomers wait for the step's agreement."""
        engine = self.engine
        schedule = rank_schedule(engine.rank, engine.collectives.world, len(head.chunks), "pipeline")
        prompt = mx.array(head.request.prompt_token_ids, dtype=mx.int32)
        head.prefill_cancelled = run_pipeline_prefill(head.run, prompt, head.chunks, schedule).cancelled
        head.next_chunk = len(head.chunks)

    def _vote(self, stream: Stream, asked: dict[str, bool]) -> bool:
        """Every step: the vote rides the step's all-reduce, which runs anyway, so polling costs a
        lookup, and a cancelled slot is free one step after the cancel is read. The rows of one task
        read its cancel once (`asked`), so all its choices stop at one step."""
        if stream.prefill_cancelled:
            return True  # agreed on every rank already
        task_id = stream.request.task_id
        if task_id not in asked:
            asked[task_id] = stream.run.wants_stop()
        return asked[task_id]

    def _apply(
        self,
        current: Composition,
        agreed: AgreedStep,
        logprobs: list[LazyLogprobs | None],
        chunked: list[Stream],
        pending: Sequence[Admission],
    ) -> tuple[StepResult, StepPlan]:
        """The agreed tokens through the boundary rows' stop rules, then the step's plan
        (`step_plan.plan_step`) carried out: the prompts handed, the rows that leave copied into the
        prefix cache and dropped, the prefilled joined, the newcomers admitted."""
        state = self.state()
        stopped = self._feed(current.rows, agreed, logprobs)
        self._chunks_done(current, agreed, chunked)
        plan = plan_step(state, agreed, stopped, [self._pending(a) for a in pending])
        self._hand_prompt(plan.handed)
        transition, micro = plan.transition, self.micro
        if plan.boundary is not None:
            boundary = micro.parts[plan.boundary]
            self._remember(boundary, transition.kept_rows)
            self._keep_rows(boundary, transition.kept_rows)
            boundary.rows = tuple(t for t in transition.composition.rows if t not in transition.joined)
        if plan.join_target is not None:
            self._join(micro.parts[plan.join_target], transition.joined)
        leaving = [self._cancelled(t, current.rows) for t in transition.cancelled]
        leaving += [self._finished(t) for t in transition.finished]
        ended = [e for e in leaving if e is not None]
        for verdict in plan.admissions:
            failed = self._admit(pending[verdict.index], verdict)
            if failed is not None:
                ended.append(failed)
        self.composition = plan.composition
        admitted = bool(plan.admissions)
        kv = (
            (batch_need([s.reserved for s in self.streams.values()]), agreed.kv_capacity) if admitted or ended else None
        )
        return StepResult(transition.newcomers, ended, kv), plan

    def _feed(self, rows: tuple[str, ...], agreed: AgreedStep, logprobs: list[LazyLogprobs | None]) -> frozenset[str]:
        """Each boundary row's agreed token into its stream; the rows it stops (a stop rule, or its
        `max_tokens`: the same rules on every rank). Only the sampling rank delivers text."""
        stopped: set[str] = set()
        settings = self.engine.settings
        decoding, per_round = len(self.micro.rows), settings.batch_chunk_events_per_round
        min_interval = settings.stream_chunk_min_interval_seconds
        for slot, task_id in enumerate(rows):
            stream = self.streams[task_id]
            since_last = time.perf_counter() - stream.emitter.delivered_at
            shown = stream.emitter.text_shown
            deliver = delivers(stream.decode_step, decoding, per_round, since_last, min_interval, text_shown=shown)
            if not agreed.cancelled[slot] and stream.emitter.accept(
                stream.decode_step, agreed.tokens[slot], logprobs[slot], deliver
            ):
                stopped.add(task_id)
            stream.next_input = agreed.tokens[slot]
            stream.fed.append(agreed.tokens[slot])
            stream.decode_step += 1
            if stream.decode_step >= stream.spec.max_tokens:
                stopped.add(task_id)
        return frozenset(stopped)

    def _pending(self, admission: Admission) -> Pending:
        """A pending assignment as the plan sees it (from its request and its preparation's verdict:
        alike on every rank that built it)."""
        request = admission.request
        if request is None:
            return Pending(admission.task_id, built=False, error=admission.error)
        return Pending(
            admission.task_id,
            invalid=self.newcomers.invalid(admission.task_id),
            n=request.n,
            prompt_len=len(request.prompt_token_ids),
            prefill_path=request.prefill_path,
            reserved=self.engine.kv_reservation(request),
        )

    def _chunks_done(self, current: Composition, agreed: AgreedStep, chunked: list[Stream]) -> None:
        """The streams that took a chunk (moved past it already) and were not cancelled report it."""
        slots = {task_id: slot for slot, task_id in enumerate(current.members)}
        for stream in chunked:
            if stream.path == "pipeline" or agreed.cancelled[slots[stream.request.task_id]]:
                continue
            stream.run.report_progress(stream.prompt_done, len(stream.request.prompt_token_ids), stream.next_chunk)

    def _hand_prompt(self, followers: tuple[str, ...]) -> None:
        """At the step a leader's prefill lands (`StepPlan.handed`), every follower waiting on it
        gets its own copy of the leader's prompt KV on this rank's layers and lands with it
        (`choices.py`): the prompt is prefilled once for all its choices. No collective: each rank
        copies its own layers."""
        for row in followers:
            follower = self.streams[row]
            assert follower.leader is not None
            leader = self.streams[follower.leader]
            owned = leader.run.caches
            follower.run.caches.replace_owned(prefix_caches([owned.slots[i] for i in owned.owned], leader.prompt_done))
            follower.cached, follower.lands_at = leader.prompt_done, self.steps

    def _remember(self, part: MicroBatch, kept_rows: tuple[int, ...]) -> None:
        """Copy every decoding row of the boundary micro-batch that leaves (finished or cancelled)
        into the prefix cache, keyed by the tokens it holds KV for: the prompt, then the agreed tokens
        fed back as inputs — all but the last, or all of them when one rank's look-ahead already fed
        it (`batch_rows.RowDecoder`). No rank holds an activation of that micro-batch now."""
        if part.cache is None or not self.prefixes.enabled:
            return
        for row, task_id in enumerate(part.rows):
            if row in kept_rows:
                continue
            stream = self.streams[task_id]
            known = [*stream.request.prompt_token_ids, *stream.fed]
            snapshot = part.cache.snapshot(row)
            if snapshot is not None and len(known) - 1 <= snapshot[0][0].offset <= len(known):
                self.prefixes.insert(known[: snapshot[0][0].offset], *snapshot, scope=stream.request.cache_scope)

    def _keep_rows(self, part: MicroBatch, kept_rows: tuple[int, ...]) -> None:
        """The boundary micro-batch's cache: no rank holds an activation of it now."""
        if part.cache is not None and len(kept_rows) < len(part.rows):
            self.row_decoder.keep(kept_rows)
            if kept_rows:
                part.cache.keep(kept_rows)
            else:
                part.cache = None

    def _join(self, part: MicroBatch, task_ids: tuple[str, ...]) -> None:
        """The prefilled streams' caches become the last rows of `part` (the boundary or an empty
        one), in order, all in one rebuild of its buffers."""
        streams = [self.streams[task_id] for task_id in task_ids]
        caches = [stream.run.caches for stream in streams]
        if part.cache is None:
            part.cache = BatchShardCache(caches[0])
            caches = caches[1:]
        else:  # lockstep on several ranks: rank 0 may have computed the rows' next step on it
            self.row_decoder.take_back(part.cache)
        rows = [self.streams[task_id] for task_id in part.rows] + streams
        part.cache.join(caches, join_room([s.spec.max_tokens - s.decode_step for s in rows]))
        for stream in streams:
            stream.next_input = stream.request.prompt_token_ids[-1]
            stream.run.caches.release()  # the batch's cache holds its KV now
        part.rows = (*part.rows, *task_ids)
        self.last_join_step = self.steps

    def _cancelled(self, task_id: str, rows: tuple[str, ...]) -> Ended | None:
        stream = self.streams[task_id]
        if stream.prefilled and task_id in rows:
            stream.emitter.cancelled(stream.decode_step - 1)  # the step whose agreement stopped it
        elif stream.run.cancelled_at is None:  # the pipeline prefill's agreement said where already
            stream.run.cancelled_at = f"prefill:{stream.next_chunk}"
        return self._end(stream, "cancelled")

    def _finished(self, task_id: str) -> Ended | None:
        stream = self.streams[task_id]
        stream.emitter.finish()
        return self._end(stream, stream.emitter.result.finish_reason)

    def _end(self, stream: Stream, finish_reason: FinishReason) -> Ended | None:
        """How the row's task ends; None while other choices of its task still run (a task of
        several choices ends once, when its last row leaves: `batch_streams.merged`)."""
        del self.streams[stream.row]
        ended = stream.ended(finish_reason)
        task_id, n = stream.request.task_id, stream.request.n
        if n == 1:
            return ended
        parts = self.choices_ended.setdefault(task_id, {})
        parts[stream.choice] = ended
        if len(parts) < n:
            return None
        del self.choices_ended[task_id]
        return merged(task_id, parts)

    def _admit(self, admission: Admission, verdict: Admit | Refuse) -> Ended | None:
        """A newcomer's stream as the plan's `verdict` says, or how it fails alone (the plan's
        `Refuse`: the same on every rank). It reuses the agreed `cached` prompt tokens, cut from the
        entry this rank held for it."""
        match, prepared = self.newcomers.admit(admission.task_id, runs=isinstance(verdict, Admit))
        if isinstance(verdict, Refuse):
            return Ended(admission.task_id, None, verdict.error, invalid_request=verdict.invalid_request)
        cached = verdict.cached
        if cached > (0 if match is None else match.length):
            raise RuntimeError(f"internal error: agreed to reuse {cached} tokens, this rank proposed fewer")
        request = admission.request
        if request is None or prepared is None:
            raise RuntimeError(f"internal error: {admission.task_id} admitted without its request")
        engine, world = self.engine, self.engine.collectives.world
        prompt_len, step = len(request.prompt_token_ids), engine.settings.prefill_step_size
        path, chunks = verdict.path, list(verdict.chunks)
        iterations = len(rank_schedule(engine.rank, world, len(chunks), path))
        run = engine.task_run(request.task_id, admission.cancel, admission.sink, self.phases)
        if match is not None and cached:
            run.caches.replace_owned(prefix_caches(match.value, cached))
        spec = engine.decode_spec(request, iterations, prepared)
        emitter = Emitter(run, spec, engine.tokenizer)
        stream = Stream(
            request,
            run,
            spec,
            emitter,
            chunks,
            time.perf_counter(),
            path,
            cached=cached,
            reserved=engine.kv_reservation(request),
        )
        self.streams[request.task_id] = stream
        for choice in range(1, request.n):
            self._follow(stream, admission, choice)
        chunk = effective_step(step, world)
        run.notify(admission.sink.prefill_started, request.task_id, path, prompt_len, len(chunks), chunk, cached)
        if path == "sequential" or not chunks:  # a pipeline prefill (one to run) reports its own start
            run.report_progress(cached, prompt_len, 0)
        return None

    def _follow(self, leader: Stream, admission: Admission, choice: int) -> None:
        """Choice `choice` of the leader's task: a row of its own with its own seed stream, no
        prompt chunk, waiting for the leader's prompt KV (`_hand_prompt`)."""
        engine = self.engine
        request = msgspec.structs.replace(leader.request, seed=choice_seed(leader.request.seed, choice))
        run = engine.task_run(request.task_id, admission.cancel, ChoiceSink(admission.sink, choice), self.phases)
        spec = engine.decode_spec(request, leader.spec.prefill_iterations, Prepared())  # n > 1 has no grammar
        stream = Stream(
            request,
            run,
            spec,
            Emitter(run, spec, engine.tokenizer),
            [],
            leader.started,
            leader.path,
            lands_at=WAITING_FOR_LEADER,
            reserved=leader.reserved,
            choice=choice,
            leader=leader.row,
        )
        self.streams[stream.row] = stream
