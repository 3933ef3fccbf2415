"""`shoal bench soak --quick` runs, and its self-checks hold: every bounded start-up (snapshot +
tail, or a full fold) holds exactly the State the snapshot's writer folded, and no more ended tasks
than the bound. Figures are not judged here: the suite runs on shared machines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_the_soak_bench_runs_quick_and_checks_itself() -> None:
    argv = [sys.executable, "-m", "services.cli", "bench", "soak", "--quick", "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["checks"] and all(result["checks"].values()), result["checks"]
    assert result["details"]["tasks_held"]["unbounded_2000"] == 2000
    assert result["details"]["tasks_held"]["snapshot_2000"] == result["settings"]["kept"]
