"""A task of several completions (`GenerationRequest.n`) on one rank's continuous batch (tiny model):
the prompt is prefilled once whatever n is (the model's prompt positions counted), each choice
decodes a row of its own with its own seed stream, and the task ends once, when its last row leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from events.runner_settings import RunnerSettings
from runner.engine.batch import ContinuousBatch
from runner.engine.batch_streams import Admission, Ended
from runner.engine.engine import Engine
from runner.engine.protocols import CancelSource, PhaseTracker
from runner.engine.requests import GenerationRequest
from runner.engine.shard import ShardPlacement
from runner.local.local_run import synthetic_prompt
from runner.local.testing.tools import FixedCancel, RecordingSink
from runner.models.tiny import cached_tiny
from runner.shard_loading import load_shard
from tests.runner.families import make_family_model

pytestmark = pytest.mark.timeout(180)
PROMPT = synthetic_prompt(40)
MAX_TOKENS = 12


class CountingModel:
    """The shard's model, counting the prompt positions its prefill forwards compute (more than one
    position per row: a decode step computes one)."""

    def __init__(self, model: Any) -> None:
        self.model, self.prompt_positions = model, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if inputs.shape[1] > 1:
            self.prompt_positions += inputs.shape[0] * inputs.shape[1]
        return self.model(inputs, *args, **kwargs)


@pytest.fixture(scope="module")
def engine_and_counter() -> tuple[Engine, CountingModel]:
    shard = load_shard(cached_tiny(), ShardPlacement(0, 1, ((0, 8),)), None)
    counter = CountingModel(shard.model)
    shard.model = counter  # type: ignore[assignment]
    settings = RunnerSettings(prefill_step_size=16, stream_chunk_min_interval_seconds=0.0, prefix_cache_bytes=0)
    return Engine(None, shard, settings), counter


def run(
    engine: Engine,
    counter: CountingModel,
    n: int,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
    max_batch: int = 8,
    cancel: CancelSource | None = None,
    cancel_at_step: int | None = None,
) -> tuple[list[Ended], RecordingSink, int, list[tuple[str, ...]]]:
    """One task of `n` choices through a fresh batch: its endings, its sink, the prompt positions
    prefilled, and the batch's members at every step."""
    sink = RecordingSink()
    request = GenerationRequest(
        task_id="t", prompt_token_ids=PROMPT, max_tokens=MAX_TOKENS, temperature=temperature, seed=seed, n=n
    )
    flag = FixedCancel(False)
    pending = [Admission("t", request, cancel or flag, sink)]
    batch = ContinuousBatch(engine, PhaseTracker(), max_batch=max_batch)
    before = counter.prompt_positions
    ended: list[Ended] = []
    members: list[tuple[str, ...]] = []
    for step in range(200):
        if not (pending or batch.busy):
            break
        if step == cancel_at_step:
            flag.cancelled = True
        result = batch.step(pending.copy)
        members.append(batch.members)
        pending[:] = [a for a in pending if a.task_id not in result.admitted]
        ended += result.ended
    return ended, sink, counter.prompt_positions - before, members


def test_n_choices_prefill_the_prompt_once(engine_and_counter: tuple[Engine, CountingModel]) -> None:
    engine, counter = engine_and_counter
    _, _, alone, _ = run(engine, counter, 1)
    ended, sink, together, members = run(engine, counter, 4, temperature=1.0, seed=3)
    assert alone == len(PROMPT) - 1  # the last prompt token goes through the first decode step
    assert together == alone  # four choices, one prefill
    assert [len(e.outcome.choices) for e in ended if e.outcome] == [4]  # ended once, with its four choices
    assert all(m in ((), ("t",)) for m in members)  # the service sees one task, not four rows
    assert len(sink.started) == 1  # the prompt's prefill reported once


def test_each_choice_has_its_own_seed_stream(engine_and_counter: tuple[Engine, CountingModel]) -> None:
    engine, counter = engine_and_counter
    _, one, _, _ = run(engine, counter, 1, temperature=1.0, seed=11)
    ended, sink, _, _ = run(engine, counter, 3, temperature=1.0, seed=11)
    _, again, _, _ = run(engine, counter, 3, temperature=1.0, seed=11)
    tokens = [sink.choice_tokens(c) for c in range(3)]
    assert tokens[0] == one.choice_tokens(0)  # choice 0 draws what n=1 draws with the seed
    assert len({tuple(t) for t in tokens}) == 3, tokens  # three different samples
    assert tokens == [again.choice_tokens(c) for c in range(3)]  # reproducible from the seed
    outcome = ended[0].outcome
    assert outcome is not None
    assert outcome.completion_tokens == sum(c.completion_tokens for c in outcome.choices)
    assert [c.completion_tokens for c in outcome.choices] == [len(t) for t in tokens]
    assert [c.index for c in outcome.choices] == [0, 1, 2]


def test_greedy_choices_are_identical(engine_and_counter: tuple[Engine, CountingModel]) -> None:
    engine, counter = engine_and_counter
    _, one, _, _ = run(engine, counter, 1)
    _, sink, _, _ = run(engine, counter, 3, seed=5)
    assert [sink.choice_tokens(c) for c in range(3)] == [one.choice_tokens(0)] * 3


def test_a_cancel_ends_every_choice_at_one_step(engine_and_counter: tuple[Engine, CountingModel]) -> None:
    engine, counter = engine_and_counter
    ended, _, _, members = run(engine, counter, 3, temperature=1.0, seed=1, cancel_at_step=6)
    assert len(ended) == 1 and ended[0].outcome is not None
    assert ended[0].outcome.finish_reason == "cancelled"
    assert {c.finish_reason for c in ended[0].outcome.choices} == {"cancelled"}
    assert members[-1] == ()  # every row left


@pytest.mark.parametrize("n", [0, 5])
def test_a_task_wider_than_the_batch_or_of_no_choice_fails_alone(
    engine_and_counter: tuple[Engine, CountingModel], n: int
) -> None:
    engine, counter = engine_and_counter
    ended, _, prefilled, _ = run(engine, counter, n, max_batch=4)
    assert len(ended) == 1 and ended[0].outcome is None and ended[0].invalid_request
    assert "n" in (ended[0].error or "")
    assert prefilled == 0


def test_a_model_with_sliding_window_layers_refuses_several_choices_and_runs_one(tmp_path: Path) -> None:
    """Its rotating caches cannot hand the prompt's KV on (`choices.hands_prompt`): the batch's plan
    refuses n > 1 at admission (the model's cache kinds, alike on every rank) and runs n = 1."""
    shard = load_shard(make_family_model(tmp_path, "gemma3_text"), ShardPlacement(0, 1, ((0, 6),)), None)
    engine = Engine(None, shard, RunnerSettings(prefill_step_size=16, prefix_cache_bytes=0))
    counter = CountingModel(shard.model)
    refused, _, _, members = run(engine, counter, 2)
    assert [(e.task_id, e.outcome, e.invalid_request) for e in refused] == [("t", None, True)]
    assert refused[0].error is not None and "RotatingKVCache" in refused[0].error
    assert all(m == () for m in members)  # it never took a step
    (one,), _, _, _ = run(engine, counter, 1)
    assert one.outcome is not None and one.outcome.completion_tokens > 0
