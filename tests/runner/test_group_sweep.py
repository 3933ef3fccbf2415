"""Real ring groups of 1, 2 and 3 ranks on the tiny model, every request served alone through the
batch loop as `shoal generate` serves it (a batch of one: `runner.engine.alone`): lengths across
chunk boundaries, both paths forced and auto, the 23-token wedge, kv_bits=8, cancel at every poll
on every rank (each prefill iteration or step, then decode steps), and a task cancelled before its
first poll. One group per world size runs every task, in order."""

from __future__ import annotations

import pytest

from runner.engine.plan import chunk_sizes, rank_schedule
from tests.runner.harness import (
    CANCEL_PROMPT,
    CHUNK,
    DECODE_CANCEL_STEPS,
    DEFAULT_STEP,
    KV8_LENGTHS,
    LENGTHS,
    NEXT_MAX_TOKENS,
    alone_callbacks,
    cancel_paths,
    expected_callbacks,
    prefill_chunks,
    prefill_polls,
    step_for,
    sweep_results,
)

pytestmark = pytest.mark.timeout(240)
WORLDS = (1, 2, 3)


def one_rank(task_id: str) -> dict:
    return sweep_results(1)[0][task_id]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("length", LENGTHS)
def test_tokens_callbacks_and_path(world: int, length: int) -> None:
    ranks = sweep_results(world)
    reference = sweep_results(1)[0][f"ref-len{length}"]
    assert reference["progress"] == [list(c) for c in expected_callbacks(length, CHUNK)]
    for path in ("auto", "pipeline", "sequential") if world > 1 else ("auto",):
        for rank, table in enumerate(ranks):
            outcome = table[f"len{length}-{path}"]
            where = f"world={world} rank={rank} len={length} path={path}"
            assert outcome["token_ids"] == reference["token_ids"], where
            assert outcome["progress"] == [list(c) for c in alone_callbacks(length, outcome["path"])], where
            if outcome["path"] == "pipeline":  # a lone task's chunks: mlx-lm's very callbacks
                assert outcome["progress"] == reference["progress"], where
            assert outcome["finish_reason"] in ("length", "stop"), where
    _check_sink(ranks, f"len{length}-auto")
    gated = "pipeline" if world > 1 and len(chunk_sizes(length, CHUNK)) >= 2 else "sequential"
    assert {table[f"len{length}-auto"]["path"] for table in ranks} == {gated}


def _check_sink(ranks: list[dict], task_id: str) -> None:
    """Tokens reach the sink on the sampling (last) rank only, in order, adding up to the outcome."""
    for rank, table in enumerate(ranks):
        outcome, sink = table[task_id], table[task_id]["sink"]
        assert [p[:2] for p in sink["progress"]] == outcome["progress"]
        assert sink["started"][0]["path"] == outcome["path"]
        if rank < len(ranks) - 1:
            assert sink["chunks"] == []
            continue
        assert "".join(text for _, text, _ in sink["chunks"]) == outcome["text"]
        assert [i for _, _, ids in sink["chunks"] for i in ids] == outcome["token_ids"]
        assert [index for index, _, _ in sink["chunks"]] == sorted({index for index, _, _ in sink["chunks"]})


@pytest.mark.parametrize("world", WORLDS)
def test_seed_wedge_23_tokens_default_step(world: int) -> None:
    reference = sweep_results(1)[0]["ref-wedge23"]
    for table in sweep_results(world):
        outcome = table["wedge23"]
        assert outcome["path"] == "sequential"  # 23 tokens make one chunk of 4096 // world
        assert outcome["token_ids"] == reference["token_ids"]
        assert outcome["progress"] == [list(c) for c in expected_callbacks(23, DEFAULT_STEP // min(4, world))]


@pytest.mark.parametrize("world", (2, 3))
@pytest.mark.parametrize("length", KV8_LENGTHS)
def test_kv_bits_8_matches_one_rank(world: int, length: int) -> None:
    expected = one_rank(f"kv8-{length}")["token_ids"]
    assert expected  # and differs from the unquantized run only through the cache
    for table in sweep_results(world):
        assert table[f"kv8-{length}"]["token_ids"] == expected


@pytest.mark.parametrize("world", WORLDS)
def test_a_task_cancelled_before_its_first_poll_stops_there_on_every_rank(world: int) -> None:
    """Cancelled on the last rank before it starts: its first poll (the first prefill iteration on
    the pipeline, its first chunk's step otherwise) stops it on every rank, and the group goes on."""
    path = "pipeline" if world > 1 else "sequential"  # CANCEL_PROMPT's auto path
    stops = {table["cancelled-first"]["cancelled_at"] for table in sweep_results(world)}
    assert stops == {"prefill:0" if path == "pipeline" else "prefill:1"}
    for table in sweep_results(world):
        assert table["cancelled-first"]["finish_reason"] == "cancelled"
        assert table["cancelled-first"]["token_ids"] == []
        assert table["after-cancelled-first"]["token_ids"] == one_rank(f"len{CANCEL_PROMPT}-auto")["token_ids"]


CANCEL_CASES = [(world, path) for world in (2, 3) for path in cancel_paths(world)]


@pytest.mark.parametrize(("world", "path"), CANCEL_CASES)
def test_cancel_at_every_prefill_poll_on_every_rank(world: int, path: str) -> None:
    """Every poll before the first token: every rank stops at the same place with no token, and the
    next task on the group runs whole. On the pipeline, poll i is iteration i of the GPipe prefill
    (then the agreement of the step that ran it); otherwise a step of the batch."""
    ranks = sweep_results(world)
    expected_next = one_rank(f"len{CANCEL_PROMPT}-auto")["token_ids"]
    polls = prefill_polls(CANCEL_PROMPT, world, path)
    chunks = len(prefill_chunks(CANCEL_PROMPT, path))
    if path == "pipeline":
        assert polls == len(rank_schedule(0, world, chunks, path)) + 1 == chunks + world
    for cancel_rank in range(world):
        for poll in range(polls):
            name = f"cancel-{path}-r{cancel_rank}-p{poll}"
            stops = {table[name]["cancelled_at"] for table in ranks}
            assert len(stops) == 1, (name, stops)  # agreed: every rank stopped at the same place
            (stop,) = stops
            if path == "pipeline" and poll < polls - 1:
                assert stop == f"prefill:{poll}", name
            else:  # a step's agreement: the chunks taken by then
                assert stop.startswith("prefill:"), (name, stop)
            for rank, table in enumerate(ranks):
                outcome, where = table[name], f"{name} seen on rank {rank}"
                assert outcome["finish_reason"] == "cancelled", where
                assert outcome["token_ids"] == [], where
                assert table[f"{name}-next"]["token_ids"] == expected_next[:NEXT_MAX_TOKENS], where


@pytest.mark.parametrize(("world", "path"), CANCEL_CASES)
def test_cancel_at_decode_token_on_every_rank(world: int, path: str) -> None:
    ranks = sweep_results(world)
    expected = one_rank(f"len{CANCEL_PROMPT}-auto")["token_ids"]
    polls = prefill_polls(CANCEL_PROMPT, world, path)
    for cancel_rank in range(world):
        for step in DECODE_CANCEL_STEPS:
            name = f"cancel-{path}-r{cancel_rank}-p{polls + step}"
            for rank, table in enumerate(ranks):
                outcome, where = table[name], f"{name} seen on rank {rank}"
                assert outcome["cancelled_at"] == f"decode:{step}", where
                assert outcome["token_ids"] == expected[:step], where
                assert table[f"{name}-next"]["token_ids"] == expected[:NEXT_MAX_TOKENS], where


def test_step_for_gives_the_same_chunk_everywhere() -> None:
    assert {step_for(world) // min(4, world) for world in WORLDS} == {CHUNK}


@pytest.mark.parametrize("world", WORLDS)
def test_failing_sink_or_cancel_source_never_splits_the_group(world: int) -> None:
    ranks = sweep_results(world)
    expected = one_rank(f"len{CANCEL_PROMPT}-auto")["token_ids"]
    for rank, table in enumerate(ranks):
        sink_failed, cancel_failed = table["sink-fails"], table["cancel-fails"]
        if rank == world - 1:  # the sampling rank owns the broken sink: the task fails there alone
            assert "publisher closed" in sink_failed["error"]
        else:
            assert sink_failed["token_ids"] == expected
        if rank == 0:  # a broken cancel source votes to stop, the others follow at once
            assert "cancel subscription lost" in cancel_failed["error"]
        else:
            assert cancel_failed["cancelled_at"] == "prefill:0"
        assert table["after-sink-fails"]["token_ids"] == expected
        assert table["after-cancel-fails"]["token_ids"] == expected


@pytest.mark.parametrize("world", (2, 3))
def test_seeded_sampling_matches_one_rank(world: int) -> None:
    expected = one_rank("sampled")["token_ids"]
    assert len(expected) == 8 and expected != one_rank(f"len{CANCEL_PROMPT}-auto")["token_ids"][:8]
    for table in sweep_results(world):
        assert table["sampled"]["token_ids"] == expected
