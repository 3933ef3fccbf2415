"""The forward of one micro-batch of decoding rows, with mlx-lm's look-ahead where it is safe.

Several ranks: each step's tokens come out of that step's all-reduce, so a rank computes one step
at a time (the forward, then the agreement, then the next forward); a non-final rank computes its
part and leaves the send queued for after the agreement (`micro_batches.py`). One rank has no collective to
keep in step with, so, like mlx-lm's `generate_step`, the forward of step n+1 is queued
(`mx.async_eval`) on the lazily sampled tokens of step n before those are read back: a batch of
one pays no round trip per token that mlx-lm alone does not pay.

The look-ahead is computed for the rows of step n. When rows leave at step n's boundary, their
look-ahead rows are dropped with them (`keep`; the cache drops its rows in the same order), so a
stream's tokens and its seeded key splits are those it takes alone. It is never started at a step
at whose end a stream may join the rows (one whose prompt is in, or takes its last chunk now: a
joining row has no look-ahead, so the step after the join computes every row afresh), nor at that
step after a join, nor under a grammar (the mask of step n+1 needs token n accepted first).
Starting it costs a forward: on a CPU, `mx.async_eval` of a forward's graph returns only once most
of what it queued has run, so the step that starts it computes two forwards before its tokens are
read. After a join that step would follow the join's copy of every row's KV (a 2,000-token
newcomer: ~30 ms on a tiny model, then two forwards of ~20 ms over the padded rows), so it starts
one step later. A step that carries an earlier prompt chunk keeps it: the chunk is queued behind
the rows' next forward, whose graph was built meanwhile.

Several ranks in lockstep: rank 0 would build its forward only once the agreement hands it the
tokens, while every other rank waits, so it *speculates* instead (`speculate`): it builds the rows'
next forward on the agreed vector while that is still on its way (`Collectives.agree_ahead`) and
queues it as soon as it lands, holding its send. Once the step's membership changes are applied
(`settle`) it starts that send if the next step is exactly what it computed (lockstep, the same
rows in the same cache), or takes the step back (the caches drop the position it wrote) and
computes the next step afresh. The other ranks see the same messages in the same order either way:
rank 0's compute moves earlier, never its sends, and it samples nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import mlx.core as mx
from mlx_lm.sample_utils import greedy_sampler

from runner.engine.batch_cache import BatchShardCache
from runner.engine.decode import DecodeSpec, sample_token
from runner.engine.engine import Engine
from runner.engine.logprobs import LazyLogprobs
from runner.engine.micro_batches import MicroBatch, MicroBatches


@dataclass(frozen=True, slots=True)
class _Drawn:
    """One step's sampled tokens ([rows]) and per-row logprobs, possibly still being computed."""

    sampled: mx.array
    logprobs: list[LazyLogprobs | None]

    def arrays(self) -> list[mx.array]:
        return [self.sampled, *(a for lp in self.logprobs for a in (lp or ()))]

    def keep(self, rows: tuple[int, ...]) -> _Drawn:
        return _Drawn(self.sampled[mx.array(rows, dtype=mx.int32)], [self.logprobs[i] for i in rows])


@dataclass(frozen=True, slots=True)
class _Speculated:
    """Rank 0's forward of the rows' next step, computed on the agreed tokens; its sends held."""

    part: MicroBatch
    rows: tuple[str, ...]
    cache: BatchShardCache
    sends: list[mx.array]


def _is_plain_greedy(spec: DecodeSpec) -> bool:
    """Argmax of the logits, no logprobs, no grammar, no adjustments: the same token as the row's own sampler."""
    return (
        spec.sampler is greedy_sampler
        and spec.top_logprobs is None
        and spec.token_mask is None
        and spec.adjustments is None
    )


class RowDecoder:
    """One rank's decode forward for the batch's rows; holds the look-ahead step, if any."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ahead: _Drawn | None = None  # step n+1 of the current rows, queued on one rank
        self.speculated: _Speculated | None = None  # rank 0 of several: the next step, until `settle`
        self.sent_ahead: BatchShardCache | None = None  # its sends started: the next `step` is done
        self.speculated_steps = 0  # how many steps rank 0 computed ahead and kept
        self.taken_back_steps = 0  # ... and took back

    def can_look_ahead(self, specs: Sequence[DecodeSpec], joining: bool) -> bool:
        """`joining`: a stream may join the rows at the end of this step (its prompt may be in), or
        one joined them at the end of the last step (`step_plan.StepWork.joining`)."""
        plain = all(s.token_mask is None for s in specs)
        return self.engine.collectives.world == 1 and not joining and plain

    def step(
        self,
        inputs: Sequence[int],
        specs: Sequence[DecodeSpec],
        cache: BatchShardCache,
        look_ahead: bool,
        send_now: bool,
    ) -> tuple[list[int], list[LazyLogprobs | None]]:
        """This step's token per row and its logprobs, if asked; none on a non-sampling rank."""
        if self.sent_ahead is not None:  # rank 0 computed this step ahead and started its sends
            if self.sent_ahead is not cache:
                raise RuntimeError("internal error: the step computed ahead was for other rows")
            self.sent_ahead = None
            return [], []
        drawn, self.ahead = self.ahead, None
        if drawn is None:
            drawn = self._forward(mx.array([[t] for t in inputs], dtype=mx.int32), specs, cache, send_now)
            if drawn is None:  # not the sampling rank: its part is computed, its send queued
                return [], []
        self.ahead = self._forward(drawn.sampled.reshape(-1, 1), specs, cache, send_now) if look_ahead else None
        if self.ahead is not None:
            mx.async_eval(*self.ahead.arrays(), *cache.states())
        else:
            mx.eval(*drawn.arrays(), *cache.states())
        return [int(t) for t in cast(list[int], drawn.sampled.tolist())], drawn.logprobs

    def can_speculate(self, part: MicroBatch) -> bool:
        """Rank 0 of several (it receives nothing and samples nothing), rows whose caches can take
        a position back."""
        engine = self.engine
        return engine.collectives.world > 1 and engine.rank == 0 and part.cache is not None and part.cache.trimmable()

    def speculate(self, part: MicroBatch, tokens: mx.array) -> list[mx.array]:
        """Build `part`'s next forward on `tokens` (lazy: the agreement still on its way); its sends
        are held until `settle`. Returns what to compute."""
        assert part.cache is not None
        outbox = self.engine.shard.outbox
        mark = outbox.mark()
        self.engine.shard.model(tokens.reshape(-1, 1), cache=part.cache.slots)
        queued = outbox.take_all(since=mark)  # [activation, send, ...]: rank 0 receives nothing
        self.speculated = _Speculated(part, part.rows, part.cache, queued[1::2])
        return [*queued[0::2], *part.cache.states()]

    def settle(self, micro: MicroBatches) -> None:
        """After the step's membership changes (and the step's own sends): start the held sends if
        the next step is the one computed ahead, else take it back where its cache still serves."""
        speculated, self.speculated = self.speculated, None
        if speculated is None:
            return
        first = micro.parts[0]
        if (
            micro.lockstep
            and first is speculated.part
            and first.rows == speculated.rows
            and first.cache is speculated.cache
        ):
            self.engine.shard.outbox.start(speculated.sends)
            self.sent_ahead = speculated.cache
            self.speculated_steps += 1
        else:
            self.taken_back_steps += 1
            if any(part.cache is speculated.cache for part in micro.parts):  # else its rows all left
                speculated.cache.trim(1)

    def take_back(self, cache: BatchShardCache) -> None:
        """Before rows join `cache`: take back the step rank 0 computed ahead on it (the join copies
        its rows up to the position they hold; a step taken back after it would cut the newcomers')."""
        speculated = self.speculated
        if speculated is not None and speculated.cache is cache:
            self.speculated = None
            self.taken_back_steps += 1
            cache.trim(1)

    def keep(self, rows: tuple[int, ...]) -> None:
        """The rows that stay, in order (the cache is filtered alike); none: wait for the step in
        flight and drop it, so nothing is left running once the batch is empty."""
        if self.ahead is None:
            return
        if rows:
            self.ahead = self.ahead.keep(rows)
        else:
            self.drop()

    def drop(self) -> None:
        if self.ahead is not None:
            mx.eval(*self.ahead.arrays())
            self.ahead = None

    def abandon(self) -> None:
        """After an error: forget the step in flight without waiting on it."""
        self.ahead = None
        self.speculated = self.sent_ahead = None

    def _forward(
        self, inputs: mx.array, specs: Sequence[DecodeSpec], cache: BatchShardCache, send_now: bool
    ) -> _Drawn | None:
        """`send_now`: lockstep, the next rank needs this part before the agreement; on the ring
        the send starts after it (micro_batches.py)."""
        engine, outbox = self.engine, self.engine.shard.outbox
        mark = outbox.mark()  # a chunk's send queued before waits for the agreement (batch_chunks.py)
        logits = engine.shard.model(inputs, cache=cache.slots)
        engine.shard.receive_gate.wait()  # the graph is built: wait for the previous rank's bytes (sends.py)
        if not engine.is_sampling_rank:
            mx.eval([*cache.states(), *(outbox.take_all(since=mark) if send_now else outbox.activations())])
            return None
        if all(_is_plain_greedy(s) for s in specs):  # one argmax for the whole batch
            return _Drawn(mx.argmax(logits[:, -1, :], axis=-1), [None] * len(specs))
        drawn = [sample_token(logits[i : i + 1, -1, :], s) for i, s in enumerate(specs)]
        return _Drawn(mx.concatenate([token.reshape(1) for token, _ in drawn]), [lp for _, lp in drawn])
