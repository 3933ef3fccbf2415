"""Continuous batching on real ring groups of 1-3 ranks (tiny model): every stream of a batch equals
the same request served alone on one rank, whatever joins, leaves or is cancelled around it, and
whatever order the ranks read their assignments in, and whatever the prefix cache serves (the
synthetic prompts of different lengths extend one another). A fixed schedule (mixed lengths, joins
mid-decode, a queue beyond `max_batch`, a cancel, a seeded sampled stream) and seeded random ones."""

from __future__ import annotations

import functools
import json
import random
from itertools import accumulate
from typing import Any

import pytest

from runner.engine.batch_streams import CREATED_MISSING
from runner.engine.pace import MAX_DECODE_SHARE, SHARE_SCALE, chunk_room
from runner.engine.plan import balanced_chunk_sizes, even_split, model_keys_per_token
from runner.engine.step_plan import UNRUNNABLE_ELSEWHERE
from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny
from tests.runner.harness import CHUNK, expected_callbacks, run_tiny_group, step_for

pytestmark = pytest.mark.timeout(300)
RANDOM_SCHEDULES = 4


def req(task_id: str, length: int, max_tokens: int = 8, **sampling: Any) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": synthetic_prompt(length), "max_tokens": max_tokens, **sampling}


def fixed_schedule(world: int) -> dict[str, Any]:
    last = world - 1
    tasks = [
        {"request": req("long", 23), "at": 0},
        {"request": req("short", 5), "at": 0},
        {"request": req("one", 1), "at": 2},
        {"request": req("sampled", 19, temperature=0.8, top_p=0.9, seed=7), "at": 3},
        {"request": req("late", 13), "at": 4, "lag": {str(last): 3}},  # the last rank reads it 3 steps late
        {"request": req("mid-step", 4), "at": 5.5, "lag": {"0": 1}},  # read during a step's forward (rank 0: the next)
        {"request": req("cancelled", 7), "at": 6, "cancel_rank": last, "cancel_at_poll": 5},
        {"request": req("queued", 9), "at": 6},  # waits for a free slot: max_batch is 4
        {"request": req("unread", 6), "at": 7, "unreadable_rank": last},  # every rank fails it, as one
    ]
    return {"kind": "batch", "name": "fixed", "max_batch": 4, "tasks": tasks}


def lone_schedule(world: int) -> dict[str, Any]:
    """Long prompts admitted into an empty batch take the overlapped pipeline prefill on 2+ ranks:
    one cancelled in the middle of it, one joined by a short request while it prefills."""
    tasks = [
        {"request": req("lone-cut", 25), "at": 0, "cancel_rank": world - 1, "cancel_at_poll": 2},
        {"request": req("lone", 25), "at": 10},
        {"request": req("joiner", 5), "at": 11},
    ]
    return {"kind": "batch", "name": "lone", "max_batch": 4, "tasks": tasks}


def burst_schedule(world: int) -> dict[str, Any]:
    """Requests arriving together, as clients of one template do: the first chunks of one length
    prefill in one forward (a one-token prompt's apart), several per step, joining the rows
    together; with 8 rows each stream's tokens go out every other step."""
    tasks = [
        {
            "request": {**req(f"burst{k}", 3), "prompt_token_ids": [(i * 41 + 7 * k) % 200 + 32 for i in range(3)]},
            "at": 0,
        }
        for k in range(8)
    ]
    tasks[0]["request"]["logprobs"] = 2  # held tokens keep their logprobs
    tasks.insert(3, {"request": req("burst-odd", 2), "at": 0})
    tasks.append({"request": req("burst-long", 13), "at": 1})
    return {"kind": "batch", "name": "burst", "max_batch": 8, "tasks": tasks}


def in_flight_schedule(world: int) -> dict[str, Any]:
    """Streams cancelled while their prompt chunks are on their way through the ranks (pipelined:
    a chunk taken at step t reaches rank r at step t + r): one beside a decoding row, then a pair
    that leaves the batch with no member but chunks still in flight, while a newcomer arrives."""
    tasks = [
        {"request": req("row", 5), "at": 0},
        {"request": req("cut", 25), "at": 1, "cancel_rank": world - 1, "cancel_at_poll": 2},
        {"request": req("pair-a", 31), "at": 14, "cancel_at_step": 17},
        {"request": req("pair-b", 30), "at": 14, "cancel_at_step": 17},
        {"request": req("after", 13), "at": 18},
    ]
    return {"kind": "batch", "name": "in-flight", "max_batch": 4, "tasks": tasks}


def many_short_schedule(world: int) -> dict[str, Any]:
    """A burst of many short prompts of mixed lengths: several chunk groups in flight at once."""
    tasks = [{"request": req(f"many{k}", 1 + k % 7, 3), "at": k // 6} for k in range(14)]
    return {"kind": "batch", "name": "many-short", "max_batch": 12, "tasks": tasks}


def stops_schedule(world: int) -> dict[str, Any]:
    """Stop strings beside rows without: the tiny model's text is numbers, so "1" stops a stream a
    few tokens in, at the same token on every rank (each detokenizes a request with stop strings);
    and a truncated seeded draw beside them."""
    tasks = [
        {"request": req("stop-alone", 5, 12, stop=["1"]), "at": 0},
        {"request": req("plain", 13, 12), "at": 4},
        {"request": req("stop-beside", 23, 12, stop=["1"]), "at": 5},
        # a seeded draw truncated by min_p and top_k, hot enough to leave the greedy path
        {"request": req("truncated", 11, 12, temperature=1.5, min_p=0.02, top_k=5, seed=3), "at": 6},
    ]
    return {"kind": "batch", "name": "stops", "max_batch": 4, "tasks": tasks}


def random_schedule(seed: int, world: int) -> dict[str, Any]:
    rng = random.Random(seed)
    tasks, at = [], 0
    for n in range(rng.randint(3, 6)):
        at += rng.randint(0, 4)
        entry: dict[str, Any] = {
            "request": req(f"r{seed}-{n}", rng.randint(1, 25), rng.randint(2, 8)),
            "at": at + rng.choice((0, 0.5)),  # or read during the step's forward
            "lag": {str(r): rng.randint(0, 3) for r in range(3)},  # the same draws on every world size
        }
        if rng.random() < 0.3:
            entry |= {"cancel_rank": rng.randrange(3) % world, "cancel_at_poll": rng.randint(0, 10)}
        tasks.append(entry)
    return {"kind": "batch", "name": f"random{seed}", "max_batch": rng.randint(2, 4), "tasks": tasks}


def schedules(world: int) -> list[dict[str, Any]]:
    return [
        fixed_schedule(world),
        lone_schedule(world),
        burst_schedule(world),
        in_flight_schedule(world),
        many_short_schedule(world),
        stops_schedule(world),
        *(random_schedule(seed, world) for seed in range(RANDOM_SCHEDULES)),
    ]


@functools.cache
def group_results(world: int, lockstep: bool = False) -> list[list[dict[str, Any]]]:
    """`lockstep`: every rank votes for the lockstep decode (`shared_cores.py`): no ring of micro-batches."""
    tasks: list[dict[str, Any]] = [{**schedule, "lockstep_decode": lockstep} for schedule in schedules(world)]
    if world == 1:  # every request of every schedule served alone (a batch of one, as `shoal generate`)
        tasks += [{"request": entry["request"]} for schedule in schedules(3) for entry in schedule["tasks"]]
    return run_tiny_group(world, tasks, {"prefill_step_size": step_for(world)})


@functools.cache
def alone() -> dict[str, dict[str, Any]]:
    return {r["task_id"]: r for r in group_results(1)[0] if r.get("kind") != "batch"}


def tiny_keys_per_token() -> float | None:
    keys = model_keys_per_token(json.loads((cached_tiny() / "config.json").read_text()))
    assert keys is not None  # a llama shape: its chunks are balanced, not cut evenly
    return keys


def batch_runs(world: int, lockstep: bool = False) -> list[list[dict[str, Any]]]:
    """Per rank, the schedules' results in order."""
    return [[r for r in results if r.get("kind") == "batch"] for results in group_results(world, lockstep)]


@pytest.mark.parametrize("world", (1, 2, 3))
def test_every_stream_equals_the_request_served_alone(world: int) -> None:
    check_every_stream_equals_the_request_served_alone(world, lockstep=False)


@pytest.mark.parametrize("world", (2, 3))
def test_in_lockstep_every_stream_equals_the_request_served_alone(world: int) -> None:
    """Ranks sharing a machine decode a heavy model's rows in lockstep, every rank taking every
    core's BLAS threads for its turn: the same tokens, joins, cancels and prefixes as on the ring."""
    check_every_stream_equals_the_request_served_alone(world, lockstep=True)
    for runs in batch_runs(world, lockstep=True):
        assert all(run["lockstep"] and run["overlapped_steps"] == 0 for run in runs)  # agreed; no ring
    for runs in batch_runs(world):  # the tiny model's layers are light: every rank votes for the ring
        assert not any(run["lockstep"] for run in runs) and any(run["overlapped_steps"] for run in runs)


def check_every_stream_equals_the_request_served_alone(world: int, lockstep: bool) -> None:
    for rank, runs in enumerate(batch_runs(world, lockstep)):
        for schedule, run in zip(schedules(world), runs, strict=True):
            assert set(run["ended"]) == {e["request"]["task_id"] for e in schedule["tasks"]}
            for entry in schedule["tasks"]:
                task_id = entry["request"]["task_id"]
                got, expected = run["ended"][task_id], alone()[task_id]
                where = f"world={world} rank={rank} schedule={schedule['name']} task={task_id}"
                if "unreadable_rank" in entry:  # the last rank could not read it: no rank runs it
                    unreadable = rank == entry["unreadable_rank"]
                    assert got["error"] == (CREATED_MISSING if unreadable else UNRUNNABLE_ELSEWHERE), where
                    continue
                if got["finish_reason"] == "cancelled":
                    assert "cancel_rank" in entry or "cancel_at_step" in entry, where
                    assert got["token_ids"] == expected["token_ids"][: len(got["token_ids"])], where
                    continue
                assert got["token_ids"] == expected["token_ids"], where
                assert got["finish_reason"] == expected["finish_reason"], where
                if got["path"] == "pipeline":  # admitted into an empty batch: mlx-lm's chunks, overlapped
                    assert got["progress"] == [list(c) for c in expected_callbacks(got["prompt_tokens"], CHUNK)], where
                else:  # chunks of equal cost from the prefix the cache served (if the prompt extends an earlier one)
                    cached, total = got["cached_tokens"], got["prompt_tokens"]
                    assert tuple(map(tuple, got["progress"])) in cuts(total, cached), where


@functools.cache
def cuts(total: int, cached: int) -> set[tuple[tuple[int, int], ...]]:
    """The progress of a prompt cut into chunks of equal cost, each leaving the room that some pace
    rank 0 may have measured gives it (`pace.chunk_room`; every rank's is the same:
    `test_every_rank_cuts_every_prompt_alike`)."""
    found = set()
    for share in range(round(MAX_DECODE_SHARE * SHARE_SCALE) + 1):
        sizes = balanced_chunk_sizes(total, CHUNK, cached, tiny_keys_per_token(), chunk_room(share))
        found.add((*((done, total) for done in accumulate([cached, *sizes])), (total, total)))
    return found


@pytest.mark.parametrize("world", (2, 3))
def test_every_rank_cuts_every_prompt_alike(world: int) -> None:
    """The chunks are cut from rank 0's pace, agreed: never from what a rank measured itself."""
    runs = batch_runs(world)
    for index, schedule in enumerate(schedules(world)):
        progress = [  # a cancel reaches each rank's part of a pipelined prefill at its own iteration
            {
                t: e.get("progress")
                for t, e in rank_runs[index]["ended"].items()
                if e.get("finish_reason") != "cancelled"
            }
            for rank_runs in runs
        ]
        assert all(view == progress[0] for view in progress), schedule["name"]


@pytest.mark.parametrize("world", (2, 3))
def test_every_rank_ends_every_task_at_the_same_point(world: int) -> None:
    runs = batch_runs(world)
    for index, schedule in enumerate(schedules(world)):
        views = [
            {
                t: (e.get("finish_reason"), e.get("cancelled_at"), e.get("token_ids"))
                for t, e in rank_runs[index]["ended"].items()
            }
            for rank_runs in runs
        ]
        assert all(view == views[0] for view in views), schedule["name"]


@pytest.mark.parametrize("world", (1, 2, 3))
def test_the_fixed_schedule_batches_joins_queues_and_cancels(world: int) -> None:
    ended = batch_runs(world)[0][0]["ended"]
    assert ended["cancelled"]["finish_reason"] == "cancelled"
    assert ended["cancelled"]["cancelled_at"] is not None
    assert ended["sampled"]["token_ids"] == alone()["sampled"]["token_ids"]  # its own key, whatever the batch


@pytest.mark.parametrize("world", (1, 3))
def test_tokens_reach_the_sampling_ranks_sink_in_order(world: int) -> None:
    runs = batch_runs(world)
    for task_id, outcome in runs[-1][0]["ended"].items():
        if "error" in outcome:  # failed before its first step ("unread")
            continue
        chunks = outcome["sink"]["chunks"]
        assert [i for _, _, ids in chunks for i in ids] == outcome["token_ids"], task_id
        assert "".join(text for _, text, _ in chunks) == outcome["text"], task_id
    if world > 1:
        assert all(not o["sink"]["chunks"] for o in runs[0][0]["ended"].values() if "error" not in o)


@pytest.mark.parametrize("world", (2, 3))
def test_only_requests_with_stop_strings_are_detokenized_off_the_sampling_rank(world: int) -> None:
    runs = batch_runs(world)
    stops = [schedule["name"] for schedule in schedules(world)].index("stops")
    sampled = runs[-1][stops]["ended"]
    assert sampled["stop-alone"]["finish_reason"] == sampled["stop-beside"]["finish_reason"] == "stop"
    assert "1" not in sampled["stop-alone"]["text"] and sampled["plain"]["text"]
    for rank_runs in runs[:-1]:
        ended = rank_runs[stops]["ended"]
        assert ended["plain"]["text"] == ""  # its tokens alone decide its stop: EOS, max_tokens
        assert ended["stop-alone"]["text"] == sampled["stop-alone"]["text"]
        assert ended["stop-beside"]["text"] == sampled["stop-beside"]["text"]


@pytest.mark.parametrize("world", (1, 3))
def test_a_full_batch_delivers_tokens_in_fewer_chunks_in_order(world: int) -> None:
    ended = batch_runs(world)[-1][2]["ended"]  # the burst schedule, on the sampling rank
    for task_id, outcome in ended.items():
        chunks, before = outcome["sink"]["chunks"], 0
        for index, _, ids in chunks:
            assert index == before, task_id
            before += len(ids)
        assert before == len(outcome["token_ids"]), task_id
    assert [lp["token_id"] for lp in ended["burst0"]["sink"]["logprobs"]] == ended["burst0"]["token_ids"]
    if world == 1:  # 8 rows in one micro-batch; on 3 ranks the ring's are smaller, and deliver every token
        assert any(len(ids) > 1 for o in ended.values() for _, _, ids in o["sink"]["chunks"])


def test_the_fixed_schedule_really_overlaps_its_streams() -> None:
    """Served one after another, the fixed schedule's tasks would take one step per prefill chunk and
    per token each; batched they take far fewer steps (more than one stream per step)."""
    run = batch_runs(1)[0][0]
    one_by_one = sum(len(o["progress"]) + len(o["token_ids"]) for o in run["ended"].values() if "error" not in o)
    assert run["steps"] < 0.6 * one_by_one, (run["steps"], one_by_one)


@pytest.mark.parametrize("world", (1, 2, 3))
def test_a_long_prompt_alone_overlaps_its_prefill_through_the_pipeline(world: int) -> None:
    for rank_runs in batch_runs(world):
        ended = rank_runs[1]["ended"]
        assert ended["lone"]["path"] == ("pipeline" if world > 1 else "sequential")
        assert ended["joiner"]["path"] == "sequential"  # admitted while the batch was not empty
        assert ended["lone-cut"]["finish_reason"] == "cancelled"
        assert ended["lone-cut"]["cancelled_at"].startswith("prefill:")


@pytest.mark.parametrize("world", (2, 3))
def test_decode_is_pipelined_through_micro_batches(world: int) -> None:
    """With several streams decoding, the rows ride more than one micro-batch, so the ranks work on
    different ones at the same step (on one rank the batch is one micro-batch)."""
    assert batch_runs(world)[0][0]["overlapped_steps"] > 0
    assert batch_runs(1)[0][0]["overlapped_steps"] == 0


@pytest.mark.parametrize("world", (2, 3))
def test_rank_zero_computes_lockstep_steps_ahead_and_no_other_rank_does(world: int) -> None:
    """In lockstep rank 0 builds the rows' next step on the agreement still on its way; every
    stream still equals the request served alone (the test above), so the steps it took back
    (a row left, a stream joined) were taken back whole."""
    first_rank = batch_runs(world)[0]
    assert first_rank[3]["speculated_steps"] > 0  # "in-flight": a row decoding alone
    assert sum(run["speculated_steps"] for run in first_rank) > 20
    assert sum(run["taken_back_steps"] for run in first_rank) > 5
    for rank_runs in [*batch_runs(world)[1:], batch_runs(1)[0]]:
        assert all(run["speculated_steps"] == run["taken_back_steps"] == 0 for run in rank_runs)


@pytest.mark.parametrize("world", (2, 3))
def test_streams_cancelled_with_chunks_in_flight_leave_the_others_running(world: int) -> None:
    for rank_runs in batch_runs(world):
        ended = rank_runs[3]["ended"]
        for task_id in ("cut", "pair-a", "pair-b"):
            assert ended[task_id]["finish_reason"] == "cancelled", task_id
            assert ended[task_id]["cancelled_at"].startswith("prefill:"), ended[task_id]["cancelled_at"]
        assert ended["row"]["finish_reason"] == ended["after"]["finish_reason"] == "length"


@pytest.mark.parametrize("world", (1, 2))
def test_an_assignment_read_during_a_step_is_admitted_by_that_step(world: int) -> None:
    """The step's agreement counts what each rank read by the end of its forward, not only what it
    held when the step began: a request is one step sooner to its first token."""
    tasks = [
        {"request": req("running", 9, 12), "at": 0},
        {"request": req("during", 5), "at": 3.5},  # read while step 3's forward runs
        {"request": req("before", 6), "at": 5},  # held when step 5 begins
    ]
    job = {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": even_split(8, world),
        "settings": {"prefill_step_size": step_for(world)},
        "warmup": False,
        "tasks": [{"kind": "batch", "name": "mid-step", "max_batch": 4, "tasks": tasks}],
    }
    for rank in run_group(job, world, deadline_s=120):
        ended = rank["results"][0]["ended"]
        assert {t: ended[t]["timing"]["admitted_step"] for t in ended} == {"running": 0, "during": 3, "before": 5}
