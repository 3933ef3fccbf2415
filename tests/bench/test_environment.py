"""Every result says what produced it: commit (and a dirty tree), machine, versions, BLAS."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.environment import RESULTS_DIR, capture, finish, git_state


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True
    )


def test_a_tree_is_dirty_when_it_differs_from_its_commit_but_not_for_recorded_results(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    clean = git_state(tmp_path)
    assert clean["dirty"] is False and len(clean["commit"]) == 40
    (tmp_path / RESULTS_DIR).mkdir(parents=True)
    (tmp_path / RESULTS_DIR / "log.json").write_text("{}\n")  # recording must not make the next run dirty
    assert git_state(tmp_path) == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_state(tmp_path) == {"commit": clean["commit"], "dirty": True}


def test_outside_a_repository_the_commit_is_unknown(tmp_path: Path) -> None:
    assert git_state(tmp_path) == {"commit": None, "dirty": None}


def test_the_environment_names_the_machine_versions_and_blas() -> None:
    env = finish(capture())
    for key in ("commit", "dirty", "cpu_model", "cpu_count", "python", "mlx", "mlx-lm", "nats-py", "nats_server"):
        assert env[key] not in (None, ""), key
    assert env["nats_server"].startswith("v")
    assert len(env["load_avg_before"]) == len(env["load_avg_after"]) == 3
    assert set(env["blas"]) == {"setting", "preloaded", "openblas_num_threads_pinned"}
