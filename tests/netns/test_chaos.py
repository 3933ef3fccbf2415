"""A short seeded chaos run (issue 46): the nemesis of `shoal bench chaos` for two and a half
minutes against a workload from three API keys, on a fresh cluster across network-namespace hosts
(three NATS servers R3 on tmpfs stores, two masters, the API, three workers), then the checker of
the whole history (`bench/chaos_check.py`). Its seed schedules eight kinds of fault: a store
filled up, asymmetric partitions, a paused NATS server, a lost quorum, a worker's clock jumped
back, a cut cable, the leading master killed, a paused worker.

Every bound is the run's own (the cluster's measured start-up time, the stall deadline, the
faults' lengths), never an absolute number of seconds. A failure prints the violations, the
schedule and the command that replays it: `shoal bench chaos --minutes 2.5 --seed 382` (see the
README for a long run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import TOPOLOGY, run_chaos
from bench.chaos_schedule import make_schedule

SEED = 382
SECONDS = 150.0

# Start-up (a minute or two on a loaded machine), the chaos, the recovery and the checks.
pytestmark = pytest.mark.timeout(1200)


def test_a_seeded_chaos_run_keeps_every_guarantee(netns_available: None, tmp_path: Path) -> None:
    schedule = make_schedule(SEED, SECONDS, TOPOLOGY)
    assert len({kind for kind, count in schedule.counts().items() if count}) >= 8, schedule.lines()
    report = run_chaos(schedule, clients=3, keep=tmp_path / "kept")
    replay = [*schedule.lines(), f"replay: shoal bench chaos --minutes {SECONDS / 60:g} --seed {SEED}"]
    assert not report.violations, "\n".join([*report.violations, *replay, f"logs and export: {tmp_path / 'kept'}"])
    assert len(report.windows) == sum(len(step.faults) for step in schedule.steps), "a fault was not applied"
    outcomes = [call.outcome for call in report.calls]
    assert outcomes.count("completed") >= 3, outcomes  # the workload ran, through the faults and after them
