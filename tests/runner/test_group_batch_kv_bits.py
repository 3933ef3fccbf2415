"""`kv_bits` inside a continuous batch, on real ring groups of 1 and 2 ranks (tiny model): the rows
share a quantized cache (`BatchQuantizedKVCache`), and every stream equals the same request served
alone with the same `kv_bits` (or parts from it only at a tie: `TIE`), whatever joins, leaves or is
cancelled around it, and whatever the prefix cache serves; its greedy tokens stay close to the
unquantized batch's (the tolerance below)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.runner.harness import run_tiny_group, step_for
from tests.runner.test_group_batch import (
    fixed_schedule,
    in_flight_schedule,
    lone_schedule,
    many_short_schedule,
    random_schedule,
)
from tests.runner.test_group_prefix import conversation

pytestmark = pytest.mark.timeout(300)
KV_BITS = {"kv_bits": 8}
# The tolerance against the unquantized batch. 8-bit keys and values (groups of 64, a scale and a
# bias each) move a token's logprobs by a few hundredths of a nat (the 40-token history's first
# token: -4.7115 to -4.6568), so a greedy token flips where the unquantized model's two best are
# closer than that (the tiny model's random weights make such near-ties common), and after a flip
# the continuation is another text. So every greedy stream equals the unquantized batch's, or parts
# from it at a position where the unquantized two best logprobs are within `QUANTIZATION_TIE`; and
# at least half the streams equal it throughout (measured: 21 of 36). A broken cache (a row reading another's
# KV, padding read as keys, rows misaligned) moves logits by whole nats and parts streams at clear
# choices.
QUANTIZATION_TIE = 0.1
MIN_SAME_STREAMS = 0.5
# Against the request alone with the same kv_bits the bits of every KV position are the same; the
# float sums around them may run in another order (another rank count, BLAS threads, a step's
# shape), which decides a greedy token only where the two best are this close (one 25-token prompt
# on 2 ranks: 1.4e-3 apart at its third token). Never seen apart on one rank.
TIE = 5e-3


def schedules(world: int) -> list[dict[str, Any]]:
    return [
        fixed_schedule(world),
        lone_schedule(world),
        in_flight_schedule(world),
        many_short_schedule(world),
        random_schedule(0, world),
        random_schedule(1, world),
    ]


def with_logprobs(schedule: dict[str, Any]) -> dict[str, Any]:
    """The schedule with every request asking for its two best logprobs (the reference's margins)."""
    tasks = [{**e, "request": {**e["request"], "logprobs": 2}} for e in schedule["tasks"]]
    return {**schedule, "tasks": tasks}


@functools.cache
def group_results(world: int) -> list[list[dict[str, Any]]]:
    """Per rank, in order: the conversation with and without the prefix cache (kv_bits; the first
    warms its engine as the service does), the schedules with kv_bits; on one rank also every
    request alone with kv_bits, and the conversation and the schedules unquantized."""
    tasks: list[dict[str, Any]] = [
        {**conversation(True), "settings": KV_BITS},
        {**conversation(False), "settings": KV_BITS},
    ]
    tasks += [{**s, "settings": KV_BITS} for s in schedules(world)]
    if world == 1:
        tasks += [
            {"request": {**e["request"], "logprobs": 2}, "settings": KV_BITS} for s in schedules(2) for e in s["tasks"]
        ]
        tasks += [with_logprobs({**conversation(True), "warm_pace": False, "name": "talk-plain"})]
        tasks += [with_logprobs(schedule) for schedule in schedules(1)]
    return run_tiny_group(world, tasks, {"prefill_step_size": step_for(world)})


@functools.cache
def alone() -> dict[str, dict[str, Any]]:
    return {r["task_id"]: r for r in group_results(1)[0] if r.get("kind") != "batch"}


def quantized_runs(world: int) -> list[list[dict[str, Any]]]:
    """Per rank, the quantized schedules' runs."""
    count = len(schedules(world))
    return [[r for r in results if r.get("kind") == "batch"][2 : 2 + count] for results in group_results(world)]


def quantized_conversations(world: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Per rank, the conversation's outcomes with the prefix cache and without it (kv_bits)."""
    batches = [[r for r in results if r.get("kind") == "batch"] for results in group_results(world)]
    return [(runs[0]["ended"], runs[1]["ended"]) for runs in batches]


def same_or_parted_at_a_tie(tokens: list[int], reference: dict[str, Any], tie: float = TIE) -> bool:
    """`tokens` equal the reference's, or equal them up to a position where the reference's two
    best logprobs are within `tie` (the rest follows another text)."""
    expected = reference["token_ids"]
    if tokens == expected:
        return True
    parted = next((i for i, (a, b) in enumerate(zip(tokens, expected, strict=False)) if a != b), None)
    if parted is None:
        return False  # one stopped earlier than the other with the same tokens
    best, runner_up = reference["sink"]["logprobs"][parted]["top"][:2]
    return best["logprob"] - runner_up["logprob"] < tie


@pytest.mark.parametrize("world", (1, 2))
def test_every_quantized_stream_equals_the_request_served_alone(world: int) -> None:
    for rank, runs in enumerate(quantized_runs(world)):
        for schedule, run in zip(schedules(world), runs, strict=False):
            assert set(run["ended"]) == {e["request"]["task_id"] for e in schedule["tasks"]}
            for entry in schedule["tasks"]:
                task_id = entry["request"]["task_id"]
                got, expected = run["ended"][task_id], alone()[task_id]
                where = f"world={world} rank={rank} schedule={schedule['name']} task={task_id}"
                if "unreadable_rank" in entry:
                    assert got["error"], where
                    continue
                if got["finish_reason"] == "cancelled":
                    assert "cancel_rank" in entry or "cancel_at_step" in entry, where
                    assert got["token_ids"] == expected["token_ids"][: len(got["token_ids"])], where
                    continue
                assert same_or_parted_at_a_tie(got["token_ids"], expected), where


@pytest.mark.parametrize("world", (1, 2))
def test_quantized_rows_join_leave_and_cancel_alike_on_every_rank(world: int) -> None:
    runs = quantized_runs(world)
    for index, schedule in enumerate(schedules(world)):
        views = [
            {
                t: (e.get("finish_reason"), e.get("cancelled_at"), e.get("token_ids"))
                for t, e in r[index]["ended"].items()
            }
            for r in runs
        ]
        assert all(view == views[0] for view in views), schedule["name"]
    for rank_runs in runs:
        fixed, lone, in_flight = rank_runs[0]["ended"], rank_runs[1]["ended"], rank_runs[2]["ended"]
        assert fixed["cancelled"]["finish_reason"] == "cancelled"
        assert fixed["queued"]["finish_reason"] == "length"  # waited for a row, then ran
        assert lone["lone-cut"]["cancelled_at"].startswith("prefill:")
        assert lone["lone"]["path"] == ("pipeline" if world > 1 else "sequential")
        for task_id in ("cut", "pair-a", "pair-b"):
            assert in_flight[task_id]["finish_reason"] == "cancelled", task_id
        assert in_flight["row"]["finish_reason"] == in_flight["after"]["finish_reason"] == "length"
        # the rows really shared the quantized cache: far fewer steps than serving them one by one
        run = rank_runs[0]
        one_by_one = sum(len(o["progress"]) + len(o["token_ids"]) for o in run["ended"].values() if "error" not in o)
        assert run["steps"] < 0.6 * one_by_one * world, (run["steps"], one_by_one)


@pytest.mark.parametrize("world", (1, 2))
def test_the_prefix_cache_serves_quantized_kv(world: int) -> None:
    """The conversation's next turn reuses the first turn's quantized KV: fewer tokens prefilled, the
    same tokens as with the cache off."""
    for on, off in quantized_conversations(world):
        assert on["second"]["cached_tokens"] > 0 and on["branch"]["cached_tokens"] > 0
        assert on["stranger"]["cached_tokens"] == 0
        assert all(off[t]["cached_tokens"] == 0 for t in off)
        for task_id in on:
            assert on[task_id]["token_ids"] == off[task_id]["token_ids"], task_id


def test_quantized_greedy_tokens_stay_close_to_the_unquantized_batch() -> None:
    results = [r for r in group_results(1)[0] if r.get("kind") == "batch"]
    count = len(schedules(1))
    quantized, plain = results[: 2 + count], results[-count - 1 :]
    named = [conversation(True), *schedules(1)]
    streams = []
    for schedule, q_run, p_run in zip(named, [quantized[0], *quantized[2:]], plain, strict=True):
        for entry in schedule["tasks"]:
            request = entry["request"]
            skipped = ("cancel_rank", "cancel_at_step", "unreadable_rank")
            if "temperature" in request or any(key in entry for key in skipped):
                continue
            task_id = request["task_id"]
            streams.append((task_id, q_run["ended"][task_id]["token_ids"], p_run["ended"][task_id]))
    assert len(streams) > 30
    for task_id, tokens, reference in streams:
        assert same_or_parted_at_a_tie(tokens, reference, QUANTIZATION_TIE), (task_id, tokens, reference)
    same = [task_id for task_id, tokens, reference in streams if tokens == reference["token_ids"]]
    assert len(same) >= MIN_SAME_STREAMS * len(streams), (len(same), len(streams))
