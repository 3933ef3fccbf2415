"""`shoal bench kv --quick`: the result's shape, every target judged, every request served.

Structure only, never a memory figure or a speed (the suite runs on shared machines)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.result import KEYS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
def test_kv_bench_runs_quick_and_serves_every_request_on_both_sides() -> None:
    argv = [sys.executable, "-m", "services.cli", "bench", "kv", "--quick", "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=190)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(result) and result["bench"] == "kv" and result["quick"] is True
    assert result["targets"]["errors"]["met"] is True
    assert result["checks"]["one_runner_per_cluster"] is True
    judged = result["targets"]["bounded_over_unbounded_growth"]
    assert isinstance(judged["met"], bool) and isinstance(judged["value"], float | int)
    for side in ("unbounded", "bounded"):
        (burst,) = result["details"]["bursts"][side]
        assert burst["served"] == result["settings"]["requests"] and burst["growth_mb"] > 0
