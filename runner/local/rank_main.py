"""One rank of a local group: `python -m runner.local.rank_main JOB.json OUT_DIR` (MLX_RANK set).

Joins the ring group, loads its shard once, runs the job's tasks in order on the same group
and writes `rank<r>.json`. A heartbeat thread keeps `rank<r>.phase` fresh so the launcher
can say where a stalled rank is.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import msgspec

from events.runner_settings import RunnerSettings
from runner.engine.protocols import CancelSource, PhaseTracker
from runner.errors import CallbackError
from runner.local.scripted import BrokenCancel, FixedCancel, RecordingSink, ScriptedCancel

HEARTBEAT_S = 0.2


def write_json_atomic(path: Path, payload: Any) -> None:
    staging = path.with_suffix(".tmp")
    staging.write_bytes(msgspec.json.encode(payload))
    staging.replace(path)


class PhaseFileWriter:
    """Background thread mirroring the PhaseTracker into a file, until `stop()`."""

    def __init__(self, phases: PhaseTracker, path: Path) -> None:
        self._phases, self._path = phases, path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="phase-file", daemon=True)

    def __enter__(self) -> PhaseFileWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            snap = self._phases.snapshot()
            write_json_atomic(
                self._path,
                {"phase": snap.phase, "task_id": snap.task_id, "iteration": snap.iteration, "since_ns": snap.since_ns},
            )


def run_job(job: dict[str, Any], rank: int, phases: PhaseTracker) -> list[dict[str, Any]]:
    import mlx.core as mx

    from runner.engine.engine import Engine, GenerationRequest
    from runner.models.shard import ShardPlacement, load_shard

    ranges = tuple((int(s), int(e)) for s, e in job["layer_ranges"])
    world = len(ranges)
    phases.enter("loading")
    group = mx.distributed.init(backend="ring", strict=True) if world > 1 else None
    shard = load_shard(Path(job["model_dir"]), ShardPlacement(rank, world, ranges), group)
    engines: dict[str, Engine] = {}

    def engine_for(overrides: dict[str, Any]) -> Engine:
        # Settings are per engine; a job may vary them per task (tests), on the same shard.
        settings = msgspec.convert({**job.get("settings", {}), **overrides}, RunnerSettings)
        key = msgspec.json.encode(settings).decode()
        if key not in engines:
            engines[key] = Engine(group, shard, settings)
        return engines[key]

    if job.get("warmup", True):
        engine_for({}).warm_up(phases)
    results = []
    for task in job["tasks"]:
        if task.get("kind") == "mlx_reference":
            results.append(mlx_reference(shard, task))
            continue
        engine = engine_for(task.get("settings", {}))
        request = msgspec.convert(task["request"], GenerationRequest)
        cancelled_before = rank in task.get("cancel_before_start_ranks", [])
        if not engine.agree_start(request.task_id, FixedCancel(cancelled_before), phases):
            results.append({"task_id": request.task_id, "skipped": True})
            continue
        sink = RecordingSink(fail_on_tokens=task.get("failing_sink_rank") == rank)
        try:
            outcome = engine.generate(request, task_cancel(task, rank), sink, phases)
        except CallbackError as err:
            results.append({"task_id": request.task_id, "callback_error": str(err)})
            continue
        results.append({**msgspec.to_builtins(outcome), "sink": msgspec.to_builtins(sink)})
    phases.enter("idle")
    return results


def task_cancel(task: dict[str, Any], rank: int) -> CancelSource:
    if task.get("failing_cancel_rank") == rank:
        return BrokenCancel()
    return ScriptedCancel(
        fire_at_poll=task.get("cancel_at_poll") if task.get("cancel_rank") == rank else None,
        die_at_poll=task.get("die_at_poll") if task.get("die_rank") == rank else None,
        freeze_at_poll=task.get("freeze_at_poll") if task.get("freeze_rank") == rank else None,
    )


def mlx_reference(shard: Any, task: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm's own stream_generate on a 1-rank shard: the tokens and callbacks to match."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    callbacks: list[tuple[int, int]] = []
    tokens = []
    for response in stream_generate(
        shard.model,
        shard.tokenizer,
        mx.array(task["prompt_token_ids"]),
        max_tokens=task["max_tokens"],
        prefill_step_size=task["step"],
        prompt_progress_callback=lambda done, total: callbacks.append((done, total)),
    ):
        if response.finish_reason == "stop" and response.token in shard.tokenizer.eos_token_ids:
            break
        tokens.append(response.token)
    return {"kind": "mlx_reference", "ref_id": task.get("ref_id"), "token_ids": tokens, "progress": callbacks}


def main(argv: list[str]) -> int:
    job_path, out_dir = Path(argv[0]), Path(argv[1])
    rank = int(os.environ.get("MLX_RANK", "0"))
    job = json.loads(job_path.read_text())
    phases = PhaseTracker()
    with PhaseFileWriter(phases, out_dir / f"rank{rank}.phase"):
        try:
            results = run_job(job, rank, phases)
        except Exception as err:
            snap = phases.snapshot()
            write_json_atomic(
                out_dir / f"rank{rank}.json",
                {"rank": rank, "error": f"{type(err).__name__}: {err}", "phase": snap.phase,
                 "traceback": traceback.format_exc()},
            )  # fmt: skip
            return 1
    write_json_atomic(out_dir / f"rank{rank}.json", {"rank": rank, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
