"""One rank of a local group: `python -m runner.local.rank_main JOB.json OUT_DIR` (MLX_RANK set).

Joins the ring group, loads its shard once, runs the job's tasks in order on the same group
and writes `rank<r>.json`. `shoal generate`'s task is a request served alone (a batch of one:
`runner.engine.alone`); a job that sets `"testing"` has its tasks run by the test-only
`runner.local.testing` instead (its keys are refused elsewhere). The flight recorder keeps
`rank<r>.phase` fresh so the launcher can say where a stalled rank is; SHOAL_TEST_FAULT, if set,
acts here as in the service. A job that sets `"timeline"` also gets every phase the rank entered,
with its wall and CPU time (`runner.local.timeline`), in `rank<r>.json`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from events.runner_settings import RunnerSettings
from runner.affinity import pin_compute_threads
from runner.blas import BlasThreads
from runner.engine.protocols import CancelSource, NeverCancelled, NullSink, PhaseTracker
from runner.flight.faults import FaultInjector
from runner.flight.recorder import FlightReading, FlightRecorder
from runner.heap import settle_heap
from runner.local.timeline import TimedPhases
from runner.ring_init import init_ring
from runner.ring_wait import RingInbound

if TYPE_CHECKING:
    from runner.engine.engine import Engine

PHASE_FILE_INTERVAL_S = 0.2  # the launcher calls a rank frozen once its file is 10 s old and it uses no CPU


def write_json_atomic(path: Path, payload: Any) -> None:
    """`payload` at `path`, whole or not at all: staged beside it under a name of its own
    (`rank0.phase.tmp`, `rank0.json.tmp`), since the phase and the result are written from two threads."""
    staging = path.with_name(path.name + ".tmp")
    staging.write_bytes(msgspec.json.encode(payload))
    staging.replace(path)


class PhaseFile:
    """The local flight-recorder destination: the phase, rewritten atomically for the launcher to read."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def record(self, reading: FlightReading) -> None:
        snap = reading.snapshot
        write_json_atomic(
            self._path,
            {"phase": snap.phase, "task_id": snap.task_id, "iteration": snap.iteration, "since_ns": snap.since_ns},
        )


@dataclass(slots=True)
class CancelAtPoll:
    """`shoal generate --cancel-at-iteration N`: cancelled from the task's poll N on.

    A request served alone is polled once per batch step from the step after its admission, and
    within a whole pipeline prefill once per iteration (idle ones included) instead, then once at
    that step's agreement: so "cancel at prefill iteration 3 on rank 1" is exact, and every poll
    after the prefill's is a decode step's (`tests/runner/test_group_sweep.py` pins the count).
    """

    fire_at_poll: int
    polls: int = 0

    def is_cancelled(self, task_id: str) -> bool:
        poll = self.polls
        self.polls += 1
        return poll >= self.fire_at_poll


def run_job(job: dict[str, Any], rank: int, phases: PhaseTracker) -> list[dict[str, Any]]:
    phases.enter("loading")  # importing MLX, mlx-lm and transformers takes seconds (20 s on a busy 2-core host)

    from runner.engine.alone import warm_up
    from runner.engine.collectives import Collectives
    from runner.engine.engine import Engine
    from runner.engine.shard import ShardPlacement
    from runner.shard_loading import load_shard

    ranges = tuple((int(s), int(e)) for s, e in job["layer_ranges"])
    world = len(ranges)
    faults = FaultInjector.from_env(rank)
    faults.loading()
    group = init_ring(rank, world) if world > 1 else None
    inbound = None if group is None else _inbound(rank)
    Collectives(group, inbound).check_members(os.environ.get("MLX_HOSTFILE", ""))  # the group's own hostfile
    shard = load_shard(Path(job["model_dir"]), ShardPlacement(rank, world, ranges), group, inbound)
    engines: dict[str, Engine] = {}

    def engine_for(overrides: dict[str, Any]) -> Engine:
        # Settings are per engine; a job may vary them per task (tests), on the same shard.
        settings = msgspec.convert({**job.get("settings", {}), **overrides}, RunnerSettings)
        key = msgspec.json.encode(settings).decode()
        if key not in engines:
            engines[key] = Engine(group, shard, settings, ranks_on_host=world)  # a local group: one machine
        return engines[key]

    if job.get("warmup", True):
        warm_up(engine_for({}), phases)
    settle_heap()  # as a served runner once it is ready: no full collection walks the model's libraries mid-run
    results = []
    for task in job["tasks"]:
        engine = engine_for(task.get("settings", {}))
        if job.get("testing"):
            from runner.local.testing.jobs import run_test_task  # test-only: not in the wheel

            results.append(run_test_task(engine, shard, task, rank, faults, phases))
        else:
            results.append(run_task(engine, task, rank, faults, phases))
    phases.enter("idle")
    return results


def _inbound(rank: int) -> RingInbound:
    """From the launcher's hostfile (`MLX_HOSTFILE`: one list of `host:port` per rank)."""
    hosts = json.loads(Path(os.environ["MLX_HOSTFILE"]).read_text())
    return RingInbound.find([entry[0] for entry in hosts], rank)


TEST_KEYS = ("kind", "cancel_before_start_ranks", "failing_cancel_rank", "failing_sink_rank")


def run_task(
    engine: Engine, task: dict[str, Any], rank: int, faults: FaultInjector, phases: PhaseTracker
) -> dict[str, Any]:
    """`shoal generate`'s request served alone (`runner.engine.alone`): its outcome, or why it failed."""
    from runner.engine.alone import alone_batch, serve_alone
    from runner.engine.batch_streams import Admission
    from runner.engine.requests import GenerationRequest

    asked = [key for key in TEST_KEYS if key in task]
    if asked:
        raise ValueError(f'task keys {asked} are test tooling: only a job with "testing" set takes them')
    request = msgspec.convert(task["request"], GenerationRequest)
    admission = Admission(request.task_id, request, faults.around(task_cancel(task, rank)), NullSink())
    ended = serve_alone(alone_batch(engine, phases), admission)
    if ended.outcome is None:
        return {"task_id": request.task_id, "error": ended.error, "invalid_request": ended.invalid_request}
    return msgspec.to_builtins(ended.outcome)


def task_cancel(task: dict[str, Any], rank: int) -> CancelSource:
    """`--cancel-at-iteration N --cancel-rank R`: that rank's poll N on; else never."""
    if task.get("cancel_rank") == rank and task.get("cancel_at_poll") is not None:
        return CancelAtPoll(task["cancel_at_poll"])
    return NeverCancelled()


def main(argv: list[str]) -> int:
    pin_compute_threads(os.environ)  # first: the threads started after inherit it (runner.affinity)
    BlasThreads.at_share(os.environ)  # a batch takes every core for its lockstep steps (`shared_cores.py`)
    job_path, out_dir = Path(argv[0]), Path(argv[1])
    rank = int(os.environ.get("MLX_RANK", "0"))
    job = json.loads(job_path.read_text())
    phases = TimedPhases() if job.get("timeline") else PhaseTracker()
    phase_file = PhaseFile(out_dir / f"rank{rank}.phase")
    with FlightRecorder(phases, phase_file, rank=rank, interval_s=PHASE_FILE_INTERVAL_S, stall_stack_seconds=None):
        try:
            results = run_job(job, rank, phases)
        except Exception as err:
            snap = phases.snapshot()
            write_json_atomic(
                out_dir / f"rank{rank}.json",
                {
                    "rank": rank,
                    "error": f"{type(err).__name__}: {err}",
                    "phase": snap.phase,
                    "traceback": traceback.format_exc(),
                },
            )
            return 1
        # Written while the heartbeat still beats: from here on the launcher has what it needs
        # and judges only the exit, by its deadline (`runner.local.launch._wait`).
        timeline = {"timeline": phases.entries} if isinstance(phases, TimedPhases) else {}
        write_json_atomic(out_dir / f"rank{rank}.json", {"rank": rank, "results": results, **timeline})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
