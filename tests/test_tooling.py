"""The tools STYLE.md asks for, run over the repository inside `uv run pytest`, so CI enforces them:
ruff's lint (its complexity check included, `[tool.ruff.lint.mccabe]`), ruff's formatter, and
basedpyright over the packages `[tool.basedpyright]` includes. Each runs as CI would from the
repository root, with the project's own configuration; a self-test shows each one can fail.

basedpyright is the slow one: about 50 s of CPU for the whole repository (5.5 min of wall time on
a 2-core machine shared by five engineers), so it runs once, in this file, which `--dist loadfile`
keeps on one worker while the other goes on with the suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the environment's scripts: ruff and basedpyright beside this python


def run_tool(args: list[str], stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=timeout
    )


def report(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stdout + done.stderr)[-6000:]


def test_ruff_finds_nothing() -> None:
    done = run_tool(["ruff", "check", "--no-cache", "."])
    assert done.returncode == 0, report(done)


def test_the_formatter_has_nothing_to_change() -> None:
    done = run_tool(["ruff", "format", "--check", "--no-cache", "."])
    assert done.returncode == 0, f"run `uv run ruff format .`:\n{report(done)}"


@pytest.mark.timeout(1200)
def test_basedpyright_finds_nothing() -> None:
    done = run_tool(["basedpyright"], timeout=1100)
    assert done.returncode == 0, report(done)


def test_ruff_sees_a_function_over_the_complexity_bound() -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(16))
    source = f"def tangled(x: int) -> int:\n{branches}    return -1\n"
    done = run_tool(["ruff", "check", "--no-cache", "--stdin-filename", "events/tangled.py", "-"], stdin=source)
    assert done.returncode == 1 and "C901" in done.stdout, report(done)


def test_the_formatter_sees_packed_code() -> None:
    source = "def f(a, b): return (a,\n  b)\n"
    done = run_tool(
        ["ruff", "format", "--check", "--no-cache", "--stdin-filename", "events/packed.py", "-"], stdin=source
    )
    assert done.returncode == 1, report(done)


def test_basedpyright_sees_a_type_error(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.py"
    wrong.write_text('count: int = "three"\n')
    done = run_tool(["basedpyright", str(wrong)], timeout=600)
    assert done.returncode == 1 and "reportAssignmentType" in done.stdout, report(done)
