"""Smoke test: `shoal bench all --quick --record DIR` runs every bench briefly and records it.

Checks the structure only (every key, every target judged as a boolean, every self-check true,
one file per bench, a renderable table), never a speed: the suite runs on shared machines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.readme_table import render_section
from bench.result import KEYS, load_records

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_FILES = {
    *("log.json", "prefill-2ranks.json", "prefill-3ranks.json", "e2e.json", "cancel.json", "replay.json"),
    "soak.json",
}


@pytest.mark.timeout(420)
def test_every_bench_runs_quick_and_is_recorded(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "services.cli", "bench", "all", "--quick", "--json", "--record", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])["results"]
    assert [r["bench"] for r in results] == ["log", "prefill", "prefill", "e2e", "cancel", "replay", "soak"]
    for result in results:
        name = result["bench"]
        assert set(KEYS) <= set(result) and result["quick"] is True, name
        assert "--quick" in result["command"] and result["environment"]["commit"], name
        assert result["targets"], name
        for target in result["targets"].values():
            assert isinstance(target["met"], bool) and isinstance(target["target"], str) and "value" in target, name
        figures = {**result["measures"], **result["comparisons"]}
        assert all("median" in figures[h] and "n" in figures[h] for h in result["headline"]), name
        assert all(result["checks"].values()), (name, result["checks"])
    assert {path.name for path in tmp_path.iterdir()} == EXPECTED_FILES
    table = render_section(load_records(tmp_path))
    assert sum(1 for line in table.splitlines() if line.startswith("| `uv run shoal bench")) == len(EXPECTED_FILES)
