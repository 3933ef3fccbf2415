"""Smoke test: `shoal bench all --quick --record DIR` runs benches briefly and records them.

Checks the structure only (every key, every target judged as a boolean, a missed one with its
note, every self-check true, one file per bench, a renderable table), never a speed: the suite
runs on shared machines. It runs the records without a quick test of their own (`--only`):
batch, kv, fair, models and log have theirs (tests/bench/test_*_bench.py), and `test_bench_cli`
holds `shoal bench all` to every record of bench/results/.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.readme_table import render_section
from bench.result import KEYS, load_records

ROOT = Path(__file__).resolve().parents[2]
ONLY = ("log", "prefill-2ranks", "prefill-3ranks", "e2e", "cancel", "replay", "soak")
EXPECTED_FILES = {f"{record}.json" for record in ONLY}


def _run_bounded(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run `argv`; past `timeout` interrupt it (SIGINT: the bench stops the clusters and processes it
    started on its way out, where a kill would leave them running on a shared machine), then kill it."""
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(f"shoal bench all --quick ran past {timeout}s: {stderr[-4000:]}")
    return process.returncode, stdout, stderr


@pytest.mark.timeout(480)
def test_every_bench_runs_quick_and_is_recorded(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "services.cli", "bench", "all", "--quick", "--json", "--record", str(tmp_path)]
    argv += ["--only", ",".join(ONLY)]
    returncode, stdout, stderr = _run_bounded(argv, timeout=400)
    assert returncode == 0, stderr[-4000:]
    ran = json.loads(stdout.strip().splitlines()[-1])
    results = ran["results"]
    assert ran["records_from_other_runs"] == [] and len(ran["trees"]) == 1
    assert [r["bench"] for r in results] == ["log", "prefill", "prefill", "e2e", "cancel", "replay", "soak"]
    for result in results:
        name = result["bench"]
        assert set(KEYS) <= set(result) and result["quick"] is True, name
        assert "--quick" in result["command"] and result["environment"]["commit"], name
        assert result["targets"], name
        for target in result["targets"].values():
            assert isinstance(target["met"], bool) and isinstance(target["target"], str) and "value" in target, name
            assert target["met"] or target["note"], name
        figures = {**result["measures"], **result["comparisons"]}
        assert all("median" in figures[h] and "n" in figures[h] for h in result["headline"]), name
        assert all(result["checks"].values()), (name, result["checks"])
    assert {path.name for path in tmp_path.iterdir()} == EXPECTED_FILES
    table = render_section(load_records(tmp_path))
    assert sum(1 for line in table.splitlines() if line.startswith("| `uv run shoal bench")) == len(EXPECTED_FILES)
