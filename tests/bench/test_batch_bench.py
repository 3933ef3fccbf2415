"""`shoal bench batch --quick`: the result's shape, every target judged, and the cancel check true.

Structure only, never a speed (the suite runs on shared machines): the check that the 15 streams
left after a cancel produced the same tokens as without it must hold on every world size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.result import KEYS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)  # 24 s alone, 39-54 s beside the suite's other worker: room for a slower machine
def test_batch_bench_runs_quick_and_keeps_the_other_streams_tokens() -> None:
    argv = [sys.executable, "-m", "services.cli", "bench", "batch", "--quick", "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(result) and result["bench"] == "batch" and result["quick"] is True
    for world in ("1r", "2r"):
        assert result["checks"][f"others_unchanged_{world}"] is True
        assert result["checks"][f"every_cancel_landed_{world}"] is True
        for name in (
            f"itl_p99_increase_{world}",
            f"itl_p99_increase_vs_slowest_chunk_{world}",
            f"cancel_free_p99_{world}",
        ):
            judged = result["targets"][name]
            assert isinstance(judged["met"], bool) and judged["target"].startswith("<= "), name
            assert isinstance(judged["value"], float | int), name
        assert result["measures"][f"chunk_ms_{world}"]["median"] > 0
        assert result["measures"][f"cancel_to_free_ms_{world}"]["p99"]["n"] == result["settings"]["cancels"]
    figures = {**result["measures"], **result["comparisons"]}
    assert all("median" in figures[name] and "n" in figures[name] for name in result["headline"])


def test_a_missed_newcomer_target_says_the_p99_gap_holds_the_slowest_chunk_beside_the_decode() -> None:
    from bench.batch import _newcomer_account  # pyright: ignore[reportPrivateUsage]

    account = _newcomer_account(with_p99=178.0, without_p99=14.8, chunk=124.0, slowest=150.0, increase=163.2)
    assert "(178.0 ms) is the step that runs its slowest chunk" in account
    assert "150.0 ms alone against 124.0 ms" in account and "28.0 ms beyond the chunk alone" in account
    assert _newcomer_account(1.0, 1.0, 1.0, 1.0, None) == "no increase was measured"
