"""A stall of the whole machine is no frozen rank.

When a VM is paused, or the host is starved for seconds, the launcher and its ranks all stop at
once. The launcher may run first when they resume, and its first poll then sees every heartbeat
older than the bound and CPU times that had no chance to move: before the launcher counted only
the silence it was there to see (`runner.local.launch.Liveness`, `LAUNCHER_GAP_S`), it failed a
healthy group here ("rank 0 stopped responding: no heartbeat for 10.1s"), as CI saw on a loaded
machine. Here the whole group, launcher included, is stopped for longer than the bound; the
launcher is continued a second before its ranks, and the task must still end with every token.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.local.launch import HEARTBEAT_STALE_S
from runner.models.tiny import cached_tiny
from tests.freeze import freeze
from tests.runner.harness import request

MAX_TOKENS = 400
DECODING = 20  # iterations of the task: its prefill's and a few decode steps
LAUNCHER = """
import json, sys
from runner.local.launch import run_group
ranks = run_group(json.loads(sys.argv[1]), 2, deadline_s=200)
print(json.dumps([rank["results"][0]["token_ids"] for rank in ranks]), flush=True)
"""


def _job() -> dict:
    return {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": [[0, 4], [4, 8]],
        "settings": {"prefill_step_size": 12},
        "warmup": False,
        "tasks": [{"request": request("stalled", 40, "pipeline", max_tokens=MAX_TOKENS)}],
    }


def _ranks_decoding(tmp: Path) -> list[int] | None:
    """The rank pids once both ranks are some steps into the task's decode, else None."""
    groups = list(tmp.glob("shoal-group-*"))
    if len(groups) != 1:
        return None
    phases = [groups[0] / f"rank{rank}.phase" for rank in (0, 1)]
    try:
        seen = [json.loads(path.read_text()) for path in phases]
    except (OSError, ValueError):
        return None
    if not all(phase.get("task_id") == "stalled" and phase.get("iteration", 0) >= DECODING for phase in seen):
        return None
    found = subprocess.run(["pgrep", "-f", f"rank_main .*{groups[0].name}"], capture_output=True, text=True)
    pids = [int(pid) for pid in found.stdout.split()]
    return pids if len(pids) == 2 else None


@pytest.mark.timeout(240)
def test_a_stall_of_the_whole_group_and_its_launcher_is_not_a_frozen_rank(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the group's work dir lands where the test can see it
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, json.dumps(_job())], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 150
        while (found := _ranks_decoding(tmp_path)) is None:
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "the group never reached decode"
            time.sleep(0.05)
        ranks = found
        freeze(launcher.pid)  # the launcher first: its last poll saw every rank beating
        for pid in ranks:
            freeze(pid)
        time.sleep(HEARTBEAT_STALE_S + 2)  # the stall itself: longer than the bound
        os.kill(launcher.pid, signal.SIGCONT)
        time.sleep(1.0)  # the launcher polls some 20 times before its ranks run again
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):  # one the launcher killed, calling it frozen
                os.kill(pid, signal.SIGCONT)
        out, err = launcher.communicate(timeout=180)
        assert launcher.returncode == 0, err.decode()[-3000:]
        tokens = json.loads(out.decode().strip().splitlines()[-1])
        assert tokens[0] and tokens[0] == tokens[1]  # every rank saw the same tokens to the task's end
    finally:
        for pid in [launcher.pid, *ranks]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        launcher.kill()
        launcher.wait()
