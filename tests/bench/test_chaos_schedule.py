"""The nemesis's schedule: a pure function of its seed, each step healed before the next, every
fault on a target that exists, never two faults of one step on the same thing."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.chaos import TOPOLOGY as CHAOS_TOPOLOGY
from bench.chaos import kinds_of
from bench.chaos_schedule import FAULT_KINDS, RANK, Fault, Schedule, Topology, make_schedule, workload
from services.cli import main

TOPOLOGY = Topology(
    nats_hosts=("nats0", "nats1", "nats2"),
    service_hosts=("control", "m1", "w0", "w1", "w2"),
    processes=("nats0", "nats1", "nats2", "master0", "master1", "api", "w0", "w1", "w2"),
)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    first = make_schedule(46, 600, TOPOLOGY)
    assert make_schedule(46, 600, TOPOLOGY) == first
    assert make_schedule(46, 600, TOPOLOGY).lines() == first.lines()
    assert make_schedule(47, 600, TOPOLOGY) != first


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), seconds=st.floats(30, 3600))
def test_every_step_heals_before_the_next_and_before_the_end(seed: int, seconds: float) -> None:
    schedule = make_schedule(seed, seconds, TOPOLOGY)
    for step, after in itertools.pairwise(schedule.steps):
        assert step.at + step.seconds < after.at
    if schedule.steps:
        last = schedule.steps[-1]
        assert last.at + last.seconds <= seconds
    assert _well_aimed(schedule)


def _held(fault: Fault) -> set[str]:
    return {fault.target, fault.detail} if fault.kind == "partition_majority" else {fault.target}


def _well_aimed(schedule: Schedule) -> bool:
    for step in schedule.steps:
        assert 1 <= len(step.faults) <= 2
        if len(step.faults) == 2:
            a, b = step.faults
            assert not (_held(a) & _held(b)), step
        for fault in step.faults:
            if fault.kind in ("kill", "pause"):
                assert fault.target in (*TOPOLOGY.processes, RANK)
            elif fault.kind in ("disk_full", "partition_majority"):
                assert fault.target in TOPOLOGY.nats_hosts
            elif fault.kind == "clock_jump":
                assert fault.target in TOPOLOGY.service_hosts
                assert 60 <= abs(int(fault.detail.removesuffix("s"))) <= 600  # minutes, either way
            else:
                assert fault.target in TOPOLOGY.hosts
    return True


def test_an_hour_schedules_every_kind_of_fault_and_some_steps_two_at_once() -> None:
    schedule = make_schedule(46, 3600, TOPOLOGY)
    assert all(count > 0 for count in schedule.counts().values()), schedule.counts()
    assert any(len(step.faults) == 2 for step in schedule.steps)


def test_only_the_kinds_asked_for_are_scheduled() -> None:
    schedule = make_schedule(3, 900, TOPOLOGY, ("pause", "shape"))
    assert {kind for kind, count in schedule.counts().items() if count} <= {"pause", "shape"}
    assert set(FAULT_KINDS) >= {"partition_deaf", "partition_mute", "clock_jump", "disk_full"}


def test_the_workload_of_a_seed_is_the_same_sequence_and_mixes_every_kind() -> None:
    first = list(itertools.islice(workload(46, 3), 200))
    assert first == list(itertools.islice(workload(46, 3), 200))
    assert {spec.kind for spec in first} == {"stream", "plain", "cancel", "structured"}
    assert {spec.key for spec in first} == {0, 1, 2}
    assert any(spec.prompt_words > 100 for spec in first) and any(spec.prompt_words < 20 for spec in first)
    assert all(spec.cancel_after_chars > 0 for spec in first if spec.kind == "cancel")


def test_shoal_bench_chaos_prints_the_schedule_of_a_seed_the_same_every_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--print-schedule` runs nothing: what a failing run printed can be reproduced and read."""
    outputs = []
    for _ in range(2):
        assert main(["bench", "chaos", "--minutes", "5", "--seed", "382", "--print-schedule", "--json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["details"]["schedule"])
    assert outputs[0] == outputs[1] == make_schedule(382, 300, CHAOS_TOPOLOGY).lines()


def test_an_unknown_fault_kind_is_refused_naming_the_choices() -> None:
    with pytest.raises(SystemExit, match="unknown \\['flood'\\]; choose from partition"):
        kinds_of("pause,flood")
