"""A stream's first text goes out as soon as it is decoded, whatever the chunk rhythm (tiny model,
one rank's continuous batch): until a delivery has carried text, every token is delivered at once,
so a first token that shows nothing (the possible start of a stop string, the first bytes of a
character split over tokens) does not hold the stream's first text back for the round's rhythm
(`stream_chunk_min_interval_seconds`, here far longer than the whole generation)."""

from __future__ import annotations

import pytest

from events.runner_settings import RunnerSettings
from runner.engine.batch import ContinuousBatch
from runner.engine.batch_streams import Admission
from runner.engine.engine import Engine
from runner.engine.protocols import PhaseTracker
from runner.engine.requests import GenerationRequest
from runner.engine.shard import ShardPlacement
from runner.local.local_run import synthetic_prompt
from runner.local.testing.tools import FixedCancel, RecordingSink
from runner.models.tiny import cached_tiny
from runner.shard_loading import load_shard

pytestmark = pytest.mark.timeout(180)
PROMPT = synthetic_prompt(24)
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def engine() -> Engine:
    shard = load_shard(cached_tiny(), ShardPlacement(0, 1, ((0, 8),)), None)
    settings = RunnerSettings(prefill_step_size=16, stream_chunk_min_interval_seconds=1.0, prefix_cache_bytes=0)
    return Engine(None, shard, settings)


def chunks_of(engine: Engine, stop: list[str]) -> list[tuple[int, str, list[int]]]:
    """The chunks one greedy stream delivered, in order, beside another stream (a batch of two,
    so the round's rhythm is not every token)."""
    sink = RecordingSink()
    pending = [
        Admission(
            task_id,
            GenerationRequest(task_id=task_id, prompt_token_ids=PROMPT, max_tokens=MAX_TOKENS, stop=stop),
            FixedCancel(False),
            sink_of,
        )
        for task_id, sink_of in (("t", sink), ("other", RecordingSink()))
    ]
    batch = ContinuousBatch(engine, PhaseTracker(), max_batch=8)
    for _ in range(200):
        if not (pending or batch.busy):
            break
        result = batch.step(pending.copy)
        pending[:] = [a for a in pending if a.task_id not in result.admitted]
    return sink.chunks


def test_the_first_text_is_not_held_for_the_rhythm(engine: Engine) -> None:
    plain = chunks_of(engine, [])
    text = "".join(t for _, t, _ in plain)
    assert plain[0][1], "the tiny model's first token is expected to show text here"
    assert len(plain[0][2]) == 1  # the first token at once, the rest at the end
    assert len(plain) == 2, plain
    # a stop string that begins as the output does and never matches: its first characters are
    # held while they may still be its start, so the first tokens deliver no text
    stop = text[:2] + "\x00"
    held = chunks_of(engine, [stop])
    assert "".join(t for _, t, _ in held) == text  # the same output, nothing lost
    assert len(held) == 2, held  # the first text as soon as the stop string let it go, the rest at the end
    assert held[0][1] and 1 < len(held[0][2]) < MAX_TOKENS, held  # it held the first token's text back
