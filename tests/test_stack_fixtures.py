"""Fake Python stacks in fixtures (what the flight recorder would report) must name real code.

`shoal diagnose` is tested on logs whose heartbeats carry such stacks; a frame naming a file or
function that no longer exists teaches the reader a layout the code does not have. Every string
literal in the repo that holds `File "<path>", line <n>, in <function>` frames is found with
`ast`, and each frame is checked against the source: the file exists (ours, or an installed
package's), the function is defined in it, and the quoted source line is in that function. The
line number itself may drift with edits above it and is not checked.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".venv", ".git", "node_modules", "__pycache__", "build", "dist"}
FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>[\w<>]+)\n(?P<code>[^\n]*)')
KNOWN_FIXTURES = ("services/ops/synthetic.py", "tests/ops/scenarios.py")


@dataclass(frozen=True, slots=True)
class Frame:
    where: str  # the fixture's file and line, for the failure message
    path: str
    function: str
    code: str


def frames_in(source: str, where: str) -> list[Frame]:
    """Every frame in the module's string literals, in source order (adjacent literals are one string)."""
    literals = [
        (node.lineno, node.col_offset, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    return [
        Frame(f"{where}:{line}", match["path"], match["function"], match["code"].strip())
        for line, _, text in sorted(literals)
        for match in FRAME.finditer(text)
    ]


def resolve(path: str) -> Path | None:
    """A repo path, or a path inside an installed package (`mlx_lm/models/llama.py`)."""
    if (ROOT / path).is_file():
        return ROOT / path
    spec = importlib.util.find_spec(path.split("/")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))).parent / path
    return candidate if candidate.is_file() else None


def problem(frame: Frame) -> str | None:
    """Why `frame` does not name real code, or None when it does."""
    target = resolve(frame.path)
    if target is None:
        return f"{frame.where}: no file {frame.path}"
    source = target.read_text(encoding="utf-8")
    lines = source.splitlines()
    defs = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == frame.function
    ]
    if not defs:
        return f"{frame.where}: {frame.path} defines no function {frame.function}"
    for node in defs:
        for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            if lines[number - 1].strip() == frame.code:
                return None
    return f"{frame.where}: {frame.function} in {frame.path} has no line {frame.code!r}"


def fixture_frames() -> list[Frame]:
    frames: list[Frame] = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if SKIP_DIRS.intersection(parts) or parts[0].startswith(".") or path == Path(__file__).resolve():
            continue
        frames.extend(frames_in(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))))
    return frames


def test_the_checker_finds_frames_and_rejects_stale_ones() -> None:
    source = (
        "STACK = (\n"
        "    'File \"runner/engine/collectives.py\", line 1, in agree\\n    mine = mx.array(values, dtype=mx.int32)\\n'\n"
        "    'File \"runner/task_run.py\", line 39, in agree_to_stop\\n    stop = 1\\n'\n"
        ")\n"
        "def f():\n"
        "    return 'File \"runner/engine/collectives.py\", line 2, in gone\\n    mx.eval(summed)\\n'\n"
        "OTHER = 'File \"runner/engine/collectives.py\", line 3, in agree\\n    not_there()\\n'\n"
    )
    frames = frames_in(source, "sample.py")
    assert [(f.path, f.function) for f in frames] == [
        ("runner/engine/collectives.py", "agree"),
        ("runner/task_run.py", "agree_to_stop"),
        ("runner/engine/collectives.py", "gone"),
        ("runner/engine/collectives.py", "agree"),
    ]
    verdicts = [problem(frame) for frame in frames]
    assert verdicts[0] is None
    assert verdicts[1] == "sample.py:2: no file runner/task_run.py"
    assert verdicts[2] == "sample.py:6: runner/engine/collectives.py defines no function gone"
    assert verdicts[3] == "sample.py:7: agree in runner/engine/collectives.py has no line 'not_there()'"


def test_installed_packages_resolve() -> None:
    assert resolve("mlx_lm/models/llama.py") is not None
    assert resolve("mlx_lm/models/no_such_model.py") is None


def test_every_stack_fixture_names_real_code() -> None:
    frames = fixture_frames()
    assert {frame.where.split(":")[0] for frame in frames} >= set(KNOWN_FIXTURES)
    problems = [p for p in map(problem, frames) if p is not None]
    assert problems == [], "stack fixtures name code that does not exist:\n" + "\n".join(problems)
