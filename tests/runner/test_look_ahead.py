"""One rank's look-ahead (`batch_rows.RowDecoder`) around a join: the step after a stream joins the
rows computes its one forward and no look-ahead, and the look-ahead starts at the step after it.

On a CPU, `mx.async_eval` of a forward returns only once most of it has run, so a step that starts
the look-ahead computes two forwards before its tokens are read. After a join, that step follows
the join's copy of every row's KV; starting the look-ahead one step later keeps the running
streams' longest gap to the copy and one forward (`shoal bench batch`: a 2,000-token newcomer
raised the 1-rank inter-token p99 by more than one prefill chunk before)."""

from __future__ import annotations

from typing import Any

import pytest

from events.runner_settings import RunnerSettings
from runner.engine.batch import ContinuousBatch
from runner.engine.batch_streams import Admission
from runner.engine.engine import Engine
from runner.engine.protocols import NeverCancelled, PhaseTracker
from runner.engine.requests import GenerationRequest
from runner.engine.shard import ShardPlacement
from runner.local.local_run import synthetic_prompt
from runner.local.testing.tools import RecordingSink
from runner.models.tiny import cached_tiny
from runner.shard_loading import load_shard

pytestmark = pytest.mark.timeout(120)
ARRIVAL = 6  # the step at which the newcomer reaches the rank: the running streams decode by then


class CountingModel:
    """The shard's model, counting its decode forwards (one position per row)."""

    def __init__(self, model: Any) -> None:
        self.model, self.decodes = model, 0

    def __getattr__(self, name: str) -> Any:  # the model's own attributes (its args, layers)
        return getattr(self.model, name)

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self.decodes += inputs.shape[1] == 1
        return self.model(inputs, *args, **kwargs)


STREAMS = {"s0": (8, 1, 24), "s1": (8, 2, 24), "new": (600, 100, 8)}  # prompt length, its offset, max_tokens


def _admission(task_id: str, sink: RecordingSink) -> Admission:
    length, shift, max_tokens = STREAMS[task_id]
    prompt = synthetic_prompt(length + shift)[shift:]
    request = GenerationRequest(task_id=task_id, prompt_token_ids=prompt, max_tokens=max_tokens)
    return Admission(task_id, request, NeverCancelled(), sink)


def _run(
    batch: ContinuousBatch, counter: CountingModel, names: list[str], arrival: int
) -> tuple[list[int], dict[str, list[int]]]:
    """`names[0:-1]` at once and the last one at step `arrival`: each step's decode forwards, and
    every stream's tokens."""
    sinks = {name: RecordingSink() for name in names}
    pending = [_admission(name, sinks[name]) for name in names[:-1]]
    forwards: list[int] = []
    while pending or batch.busy or len(forwards) <= arrival:
        if len(forwards) == arrival:
            pending.append(_admission(names[-1], sinks[names[-1]]))
        before = counter.decodes
        result = batch.step(pending.copy)
        forwards.append(counter.decodes - before)
        pending[:] = [a for a in pending if a.task_id not in result.admitted]
    return forwards, {name: [i for _, _, ids in sink.chunks for i in ids] for name, sink in sinks.items()}


def test_the_look_ahead_starts_the_step_after_the_one_that_follows_a_join() -> None:
    shard = load_shard(cached_tiny(), ShardPlacement(0, 1, ((0, 8),)), None)
    counter = CountingModel(shard.model)
    shard.model = counter  # type: ignore[assignment]
    engine = Engine(None, shard, RunnerSettings(prefill_step_size=128, stream_chunk_min_interval_seconds=0.0))
    batch = ContinuousBatch(engine, PhaseTracker(), max_batch=3)
    joins: list[int] = []
    join = batch._join

    def recording_join(part: Any, task_ids: tuple[str, ...]) -> None:
        joins.append(batch.steps)
        join(part, task_ids)

    batch._join = recording_join  # type: ignore[method-assign]
    forwards, tokens = _run(batch, counter, ["s0", "s1", "new"], ARRIVAL)
    newcomer_join = joins[-1]
    assert newcomer_join > ARRIVAL + 2, (joins, forwards)  # its prompt took chunks while the rows decoded
    # the step after the join: one forward; the next starts the look-ahead (two); then one a step
    assert forwards[newcomer_join + 1 : newcomer_join + 4] == [1, 2, 1], (newcomer_join, forwards)
    for name in STREAMS:  # and every stream's tokens are those it gets alone
        single = ContinuousBatch(engine, PhaseTracker(), max_batch=1)
        assert _run(single, counter, [name], 0)[1][name] == tokens[name], name


def test_a_request_alone_on_one_rank_decodes_with_mlx_lms_look_ahead() -> None:
    """Served alone (`shoal generate`, the warm-up: a batch of one), one rank queues each step's
    forward on the lazily sampled tokens of the last, as mlx-lm's `generate_step` does: once the
    step after its join has run, one step computes two forwards and every later one one, and its
    tokens are those it gets in a batch with others."""
    from runner.engine.alone import alone_batch

    shard = load_shard(cached_tiny(), ShardPlacement(0, 1, ((0, 8),)), None)
    counter = CountingModel(shard.model)
    shard.model = counter  # type: ignore[assignment]
    engine = Engine(None, shard, RunnerSettings(prefill_step_size=128, stream_chunk_min_interval_seconds=0.0))
    forwards, tokens = _run(alone_batch(engine, PhaseTracker()), counter, ["s0"], 0)
    decoding = forwards[forwards.index(1) :]
    assert decoding[:3] == [1, 2, 1] and set(decoding[3:]) <= {0, 1}, forwards
    assert len(tokens["s0"]) == STREAMS["s0"][2]
    shared = ContinuousBatch(engine, PhaseTracker(), max_batch=3)
    assert _run(shared, counter, ["s0", "s1"], 0)[1]["s0"] == tokens["s0"]
