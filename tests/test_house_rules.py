"""House rules from docs/ARCHITECTURE.md §1 that a test can hold: mlx is imported only under runner/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAY_IMPORT_MLX = ("runner", "tests", "bench")
SKIP_DIRS = {".venv", ".git", "node_modules", "__pycache__", "build", "dist"}


MLX_PACKAGES = {"mlx", "mlx_lm"}  # mlx_lm imports mlx


def imports_mlx(source: str) -> list[int]:
    """Line numbers of `import mlx...` / `from mlx... import` anywhere in the module (lazy ones too)."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] in MLX_PACKAGES for name in names):
            lines.append(node.lineno)
    return lines


def python_files_outside_runner() -> list[Path]:
    files: list[Path] = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if SKIP_DIRS.intersection(parts) or parts[0].startswith("."):
            continue
        if len(parts) > 1 and parts[0] in MAY_IMPORT_MLX:
            continue
        files.append(path)
    return files


def test_the_checker_sees_every_import_form() -> None:
    source = "import os\nimport mlx.core as mx\nfrom mlx import nn\ndef f():\n    from mlx.utils import tree_map\n"
    assert imports_mlx(source) == [2, 3, 5]
    assert imports_mlx("import mlx_lm\nfrom mlxx import y\nfrom .mlx import z\nimport mlx_whisper\n") == [1]


def test_mlx_is_imported_only_under_runner() -> None:
    files = python_files_outside_runner()
    assert any(p.relative_to(ROOT).parts[0] == "events" for p in files)
    assert any(p.relative_to(ROOT).parts[0] == "services" for p in files)
    offenders = [
        f"{path.relative_to(ROOT)}:{line}" for path in files for line in imports_mlx(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], f"mlx imported outside runner/ (docs/ARCHITECTURE.md §1): {offenders}"
