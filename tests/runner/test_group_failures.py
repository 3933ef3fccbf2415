"""Uneven layer splits, and a rank that dies or stalls: the launcher names it, never hangs."""

from __future__ import annotations

import time

import pytest

from runner.errors import RankFailedError
from runner.flight.faults import FAULT_ENV
from runner.local.launch import run_group
from runner.models.tiny import cached_tiny
from tests.runner.harness import CANCEL_PROMPT, request, step_for, sweep_results


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ranges", [((0, 1), (1, 8)), ((0, 7), (7, 8)), ((0, 1), (1, 2), (2, 8))])
def test_uneven_splits_match_one_rank(ranges: tuple[tuple[int, int], ...]) -> None:
    world = len(ranges)
    job = {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": [list(r) for r in ranges],
        "settings": {"prefill_step_size": step_for(world)},
        "warmup": False,
        "tasks": [{"request": request(f"uneven-{path}", CANCEL_PROMPT, path)} for path in ("pipeline", "sequential")],
    }
    expected = sweep_results(1)[0][f"len{CANCEL_PROMPT}-auto"]["token_ids"]
    for rank_result in run_group(job, world, deadline_s=90):
        assert [o["token_ids"] for o in rank_result["results"]] == [expected, expected]


def _long_job(world: int) -> dict:
    task = {"request": request("victim", 40, "pipeline", max_tokens=4)}
    return {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": {2: [[0, 4], [4, 8]], 3: [[0, 3], [3, 6], [6, 8]]}[world],
        "settings": {"prefill_step_size": 12},
        "warmup": False,
        "tasks": [task],
    }


def fault(spec: str) -> dict[str, str]:
    """The fault injector the service uses too: on the pipeline, poll i is prefill iteration i."""
    return {FAULT_ENV: spec}


@pytest.mark.timeout(90)
def test_rank_killed_mid_prefill_fails_fast_naming_it() -> None:
    with pytest.raises(RankFailedError) as failure:
        run_group(_long_job(3), 3, deadline_s=60, extra_env=fault("die:1:3"))  # poll 3: prefill iteration 3
    assert failure.value.rank == 1
    assert "rank 1" in str(failure.value) and "SIGKILL" in str(failure.value)  # not the deadline's "stalled"


@pytest.mark.timeout(90)
def test_frozen_rank_is_named_from_its_silent_heartbeat() -> None:
    job = _long_job(3)
    job["tasks"][0]["request"]["max_tokens"] = 400
    with pytest.raises(RankFailedError) as failure:
        # Polls 0-11 are the prefill's iterations, 12 its step's, then one per decode token: poll 200 is
        # some 187 tokens in, well past the first heartbeats (every 0.2 s) after loading, even on a fast idle host.
        run_group(job, 3, deadline_s=80, extra_env=fault("freeze:2:200"))
    assert failure.value.rank == 2
    message = str(failure.value)
    # The last heartbeat may be a step or two older than the freeze; it names the task either way.
    assert "rank 2 stopped responding" in message and "(task victim, iteration" in message  # not the deadline's


@pytest.mark.timeout(180)
def test_the_last_rank_waits_for_a_rank_0_that_starts_after_mlxs_connect_attempts() -> None:
    """Rank 0 sleeps 20 s before it joins the ring, longer than the 15 s mlx's ring gives the last
    rank's connect to it (a rank 0 still importing MLX on a loaded host): the last rank connects
    again (`runner.ring_init`) and the run completes. Without the retry: "[ring] Couldn't connect
    (error: 111)" and the whole run fails."""
    job = _long_job(2)
    for rank_result in run_group(job, 2, deadline_s=150, extra_env=fault("sleep:0:load:20")):
        assert len(rank_result["results"]) == 1


@pytest.mark.timeout(90)
def test_deadline_turns_a_stall_into_an_error() -> None:
    job = _long_job(2)
    job["tasks"][0]["request"]["max_tokens"] = 100_000  # far more work than the deadline allows
    started = time.monotonic()
    with pytest.raises(RankFailedError, match="stalled"):
        run_group(job, 2, deadline_s=5)
    assert time.monotonic() - started < 30


def _batch_job() -> dict:
    """Three streams sharing a batch on two ranks, long enough for a fault to strike mid-batch."""
    streams = [{"request": request(f"mate{n}", 13, max_tokens=200), "at": n} for n in range(3)]
    return {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": [[0, 4], [4, 8]],
        "settings": {"prefill_step_size": 12},
        "warmup": False,
        "tasks": [{"kind": "batch", "max_batch": 4, "tasks": streams}],
    }


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("spec", "named"), [("die:1:12", "SIGKILL"), ("freeze:0:12", "stopped responding")])
def test_a_rank_lost_mid_batch_is_named_and_nothing_hangs(spec: str, named: str) -> None:
    with pytest.raises(RankFailedError) as failure:
        run_group(_batch_job(), 2, deadline_s=60, extra_env=fault(spec))  # poll 12: the batch is decoding
    assert failure.value.rank == int(spec.split(":")[1])
    assert named in str(failure.value)  # the liveness rule's verdict, not the deadline's "stalled"
