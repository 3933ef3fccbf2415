from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.replay import diagnose_account, read_decode_fold, run
from bench.replay_log import generate
from services.ops.offline import diagnose_file


def test_generated_log_folds_and_diagnose_finds_the_planted_faults(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    records = generate(path, tasks=15, seed=1)
    fold = read_decode_fold(path)
    assert fold["records"] == records and fold["events_folded"] + fold["heartbeats_indexed"] == records
    causes = {(f.cause, f.subject) for f in diagnose_file(path).findings}
    assert causes == {("rank_error", "task_000013"), ("stalled_in_compute", "task_000014")}


@pytest.mark.timeout(60)
def test_bench_reports_rounds_and_targets(tmp_path: Path) -> None:
    args = argparse.Namespace(
        tasks=3,
        rounds=2,
        recorder_seconds=None,
        recorder_rounds=None,
        out=tmp_path / "b.jsonl",
        seed=2,
        skip_recorder=True,
        quick=True,
    )
    result = run(args)
    assert result["details"]["records_generated"] > 1000 and "beat_cost_us" not in result["measures"]
    assert result["measures"]["diagnose_s"]["n"] == result["measures"]["fold_events_per_s"]["n"] == 2
    assert set(result["targets"]) == {
        "fold_events_per_s",
        "fold_events_per_cpu_s",
        "diagnose_s",
        "diagnose_cpu_s",
        "diagnose_peak_rss_mib",
    }
    assert all(isinstance(t["met"], bool) for t in result["targets"].values())
    assert all(result["checks"].values()) and result["details"]["findings"] == ["stalled_in_compute:task_000002"]


def test_a_missed_diagnose_target_says_it_costs_what_folding_every_record_costs() -> None:
    account = diagnose_account(1_000_000, 200_000.0, 5.2)
    assert "1,000,000 records at the fold's 5.00 us each (fold_events_per_s) are 5.00 s of its 5.20 s" in account
    assert diagnose_account(10, None, 5.2) == "no fold or no diagnose was measured"
