from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.replay import generate, measure_fold, run
from services.ops.offline import diagnose_file


def test_generated_log_folds_and_diagnose_finds_the_planted_faults(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    records = generate(path, tasks=15, seed=1)
    fold = measure_fold(path)
    assert fold["records"] == records and fold["events_folded"] + fold["heartbeats_indexed"] == records
    causes = {(f.cause, f.subject) for f in diagnose_file(path).findings}
    assert causes == {("rank_error", "task_000013"), ("stalled_in_compute", "task_000014")}


@pytest.mark.timeout(60)
def test_bench_reports_targets(tmp_path: Path) -> None:
    args = argparse.Namespace(tasks=3, out=tmp_path / "b.jsonl", seed=2, recorder_seconds=0.05, skip_recorder=True)
    result = run(args)
    assert result["records_generated"] > 1000 and "flight_recorder" not in result
    assert set(result["targets"]) >= {"fold_met", "diagnose_time_met", "diagnose_memory_met"}
    assert result["findings"] == ["stalled_in_compute:task_000002"]
