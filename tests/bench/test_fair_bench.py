"""`shoal bench fair --quick`: the result's shape, the target judged, every request served on both
sides. Structure only, never a speed (the suite runs on shared machines); the fairness itself is
held by `tests/security/test_api_keys.py` and `tests/services/master/test_fair_share.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.result import KEYS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_fair_bench_runs_quick_on_both_sides() -> None:
    argv = [sys.executable, "-m", "services.cli", "bench", "fair", "--quick", "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(result) and result["bench"] == "fair" and result["quick"] is True
    judged = result["targets"]["shoal_1w_own_key_light_wait_in_streams"]
    assert isinstance(judged["met"], bool) and judged["value"] > 0
    for side in ("mlx_lm_server", "shoal_1w_own_key", "shoal_1w_flood_key"):
        (round_,) = result["details"]["rounds"][side]
        assert round_["flood_tps"] > 0 and round_["stream_ms"] > 0 and round_["light_ttft_ms"] > 0
