"""Each runner's stderr in a bounded file of its own under the worker's data dir (issue 46)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.ids import InstanceId
from services.config import ConfigError, ShoalConfig, resolve_config
from services.roles import worker_settings
from services.worker.plan import RunnerKey
from services.worker.procs import RunnerProcesses
from services.worker.runner_logs import (
    RUNNER_LOG_BYTES,
    RUNNER_LOG_BYTES_LEAST,
    BoundedLog,
    prune_runner_logs,
    runner_log_name,
    runner_logs_dir,
)

LIMIT = RUNNER_LOG_BYTES_LEAST


def _on_disk(path: Path) -> int:
    rotated = path.with_name(path.name + ".1")
    return path.stat().st_size + (rotated.stat().st_size if rotated.exists() else 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=3000), max_size=40))
def test_a_runner_never_holds_more_than_its_bound_and_the_newest_line_is_kept(lines: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "i.rank0.log"
        log = BoundedLog(path, LIMIT)
        for line in lines:
            log.write_line(line)
        log.close()
        assert _on_disk(path) <= LIMIT
        if lines:
            newest = (lines[-1].rstrip("\n") + "\n").encode(errors="replace")
            text = path.read_bytes()
            assert text.endswith(newest) or text.endswith(b" [cut]\n")


def test_a_full_file_rotates_to_dot_1_and_the_older_half_goes(tmp_path: Path) -> None:
    path = tmp_path / "i.rank1.log"
    log = BoundedLog(path, LIMIT)
    for n in range(200):
        log.write_line(f"line {n:04d} " + "x" * 40)
    log.close()
    rotated = path.with_name(path.name + ".1").read_text().splitlines()
    current = path.read_text().splitlines()
    assert current[-1].startswith("line 0199")
    # the two files together are the newest lines, in order, with no gap between them
    numbers = [int(line.split()[1]) for line in rotated + current]
    assert numbers == list(range(numbers[0], 200))
    assert numbers[0] > 0


def test_a_file_reopened_after_a_restart_appends(tmp_path: Path) -> None:
    path = tmp_path / "i.rank0.log"
    first = BoundedLog(path, LIMIT)
    first.write_line("before")
    first.close()
    second = BoundedLog(path, LIMIT)
    second.write_line("after")
    second.close()
    assert path.read_text() == "before\nafter\n"


def test_a_bound_too_small_for_a_traceback_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="runner_log_bytes"):
        BoundedLog(tmp_path / "x.log", LIMIT - 1)


def test_only_the_newest_runners_files_are_kept(tmp_path: Path) -> None:
    for n in range(5):
        path = tmp_path / runner_log_name(InstanceId(f"inst-{n}"), 0)
        path.write_text("x")
        path.with_name(path.name + ".1").write_text("y")
        os.utime(path, (1000 + n, 1000 + n))
    removed = prune_runner_logs(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "inst-3.rank0.log",
        "inst-3.rank0.log.1",
        "inst-4.rank0.log",
        "inst-4.rank0.log.1",
    ]
    assert len(removed) == 6
    assert prune_runner_logs(tmp_path / "missing") == []


def test_the_setting_has_one_default_and_a_floor() -> None:
    assert ShoalConfig().runner_log_bytes == RUNNER_LOG_BYTES
    with pytest.raises(ConfigError, match="runner_log_bytes"):
        resolve_config({}, env={"SHOAL_RUNNER_LOG_BYTES": "10"}, yaml_path=None)


def test_the_worker_keeps_its_runners_files_under_its_data_dir_per_node(tmp_path: Path) -> None:
    config = resolve_config({}, env={"SHOAL_DATA_DIR": str(tmp_path)}, yaml_path=None).config
    settings = worker_settings(config, "node-a")
    assert Path(settings.runner_logs_dir) == runner_logs_dir(tmp_path, "node-a")
    assert settings.runner_log_bytes == RUNNER_LOG_BYTES


async def _run_one(tmp_path: Path, script: str) -> tuple[Path, list[tuple[RunnerKey, int, str]]]:
    exits: list[tuple[RunnerKey, int, str]] = []
    ended = asyncio.Event()

    async def on_exit(key: RunnerKey, code: int, tail: str) -> None:
        exits.append((key, code, tail))
        ended.set()

    key: RunnerKey = (InstanceId("inst-x"), 2)
    async with asyncio.TaskGroup() as group:
        procs = RunnerProcesses(group, on_exit, log_dir=tmp_path / "logs", log_bytes=LIMIT)
        await procs.start(key, ["-c", script], dict(os.environ))
        await asyncio.wait_for(ended.wait(), 60)
    return tmp_path / "logs" / runner_log_name(*key), exits


def test_a_dying_runners_stderr_is_in_its_file_with_how_it_ended(tmp_path: Path) -> None:
    script = "import sys; print('loaded the model', file=sys.stderr); raise RuntimeError('boom in rank 2')"
    path, exits = asyncio.run(_run_one(tmp_path, script))
    text = path.read_text()
    assert "started, pid" in text.splitlines()[0]
    assert "loaded the model" in text and "RuntimeError: boom in rank 2" in text
    assert text.splitlines()[-1].endswith("exited with status 1")
    assert exits and "boom in rank 2" in exits[0][2]  # the exit report's tail is still the same


def test_a_runner_whose_file_cannot_be_written_still_runs(tmp_path: Path) -> None:
    (tmp_path / "logs").write_text("a file where the directory should be")
    script = "import sys; print('still here', file=sys.stderr)"
    _, exits = asyncio.run(_run_one(tmp_path, script))
    assert exits == [((InstanceId("inst-x"), 2), 0, "still here")]  # the exit report's tail, as without a file
