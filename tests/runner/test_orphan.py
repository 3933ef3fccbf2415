"""A runner whose worker died says so and hands over what it queued before it exits, within a
bound (issue 46: a sampling rank that vanished with its worker left a task every rank had ended
with no terminal event on the log)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from runner.service.orphan import ORPHAN_EXIT, ExitWithParent


class FakeParent:
    def __init__(self) -> None:
        self.pid = 100

    def __call__(self) -> int:
        return self.pid


def test_the_last_words_are_spoken_before_the_exit_with_their_bound() -> None:
    parent, said, exits = FakeParent(), [], []
    orphan = ExitWithParent(0.01, flush_seconds=2.5, exit_process=exits.append, parent_pid=parent)
    orphan.before_exit(lambda seconds: said.append((seconds, list(exits))))
    thread = orphan.start()
    parent.pid = 1  # re-parented: the worker is gone
    thread.join(10)
    assert said == [(2.5, [])]  # spoken first, given the bound
    assert exits == [ORPHAN_EXIT]


def test_a_wedged_last_word_never_keeps_the_runner_alive() -> None:
    exits: list[int] = []
    forever = threading.Event()
    orphan = ExitWithParent(0.01, flush_seconds=0.2, exit_process=exits.append, parent_pid=FakeParent())
    orphan.before_exit(lambda _seconds: forever.wait(60))
    started = time.monotonic()
    orphan.orphaned()
    taken = time.monotonic() - started
    forever.set()
    assert exits == [ORPHAN_EXIT]
    assert taken < 60 / 2  # bounded by the flush bound and a second, not by the wedged call


def test_a_runner_orphaned_before_it_could_publish_exits_at_once() -> None:
    exits: list[int] = []
    ExitWithParent(0.01, exit_process=exits.append, parent_pid=FakeParent()).orphaned()
    assert exits == [ORPHAN_EXIT]


GRANDCHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from runner.service.orphan import ExitWithParent
    out = Path(sys.argv[1])
    orphan = ExitWithParent(0.05)
    orphan.before_exit(lambda seconds: out.write_text(f"last words within {seconds}s"))
    orphan.start()
    print("watching", flush=True)
    time.sleep(120)
    """
)
PARENT = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
    print(child.pid, flush=True)
    print(child.stdout.readline().strip(), flush=True)
    child.wait()
    """
)


def test_a_runner_whose_worker_is_sigkilled_speaks_and_exits(tmp_path: Path) -> None:
    out = tmp_path / "said"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, GRANDCHILD, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "watching"
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 60
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid), "the orphan outlived its worker"
        assert out.read_text() == "last words within 5.0s"
    finally:
        if _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of an exited orphan is reaped by init; until then its state is Z
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False
