"""House rules a test can hold (docs/ARCHITECTURE.md §1, STYLE.md): who may import what.

- `events/` is the pure vocabulary: no sockets, event loops, NATS, subprocesses, threads, and
  none of the log's I/O (`eventlog/`) or the packages built on it.
- Only `runner/` (plus `tests/` and `bench/`) imports mlx.
- `runner/engine/` decides and computes, the shells do I/O: no sockets, event loops, NATS,
  subprocesses, threads, signals, files (`os`, `pathlib`, `shutil`, `tempfile`, `io`, `open()`),
  logging or printing, and no shell (`runner.local`, `runner.service`, `runner.flight`) or log
  package (`events`, `eventlog`, `services`) — except the pure shared types it must speak
  (`events.vocabulary`, `events.runner_settings`, `events.logprobs`, `events.constraints`). The ring collectives it issues through mlx are its job.
- `runner/` never imports `services/` (the services start runners as processes).

Files are split by responsibility, not by a line count: no cap here (a count invites packing code
under it); ruff's complexity check flags the long functions instead (`tests/test_tooling.py`).

Imports are read with `ast`, so a lazy import inside a function counts as much as one at the top;
relative imports are resolved against the file's package, and `importlib.import_module("x")` /
`__import__("x")` with a literal name count too. Each rule has a self-test proving the checker
sees the forms it must: a checker that sees nothing would pass everything.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".venv", ".git", "node_modules", "__pycache__", "build", "dist"}

MAY_IMPORT_MLX = ("runner", "tests", "bench")
MLX = ("mlx", "mlx_lm")  # mlx_lm imports mlx
EVENTS_MAY_NOT_IMPORT = ("socket", "asyncio", "nats", "subprocess", "threading", "eventlog", "services", "runner")
ENGINE_MAY_NOT_IMPORT = (
    *("socket", "ssl", "asyncio", "nats", "subprocess", "threading", "multiprocessing", "concurrent", "signal"),
    *("os", "pathlib", "shutil", "tempfile", "io", "logging", "loguru"),
    *("events", "eventlog", "services", "runner.local", "runner.service", "runner.flight"),
)
ENGINE_MAY_IMPORT_ANYWAY = (  # pure value types
    *("events.vocabulary", "events.runner_settings", "events.logprobs", "events.constraints", "events.task_params"),
)
ENGINE_MAY_NOT_CALL = ("open", "print", "input", "breakpoint")
RUNNER_MAY_NOT_IMPORT = ("services",)


@dataclass(frozen=True, slots=True)
class Import:
    line: int
    module: str  # absolute and dotted; `from a import b` gives `a` and `a.b` (b may be a module)


def imports(source: str, package: str = "") -> list[Import]:
    """Every import in the module, lazy ones too; `package` resolves the relative ones."""
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            found.append(Import(node.lineno, base))
            found.extend(Import(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append(Import(node.lineno, first.value))
    return sorted(found, key=lambda imp: (imp.line, imp.module))


def _absolute(module: str | None, level: int, package: str) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def calls_to(source: str, names: Iterable[str]) -> list[tuple[int, str]]:
    """Calls of the bare builtins `names` (`open(...)`, not `path.open(...)` or `mx.eval(...)`)."""
    wanted = set(names)
    return sorted(
        (node.lineno, node.func.id)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in wanted
    )


def is_within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def python_files(under: str | None = None) -> list[Path]:
    top = ROOT / under if under else ROOT
    files: list[Path] = []
    for path in sorted(top.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if not SKIP_DIRS.intersection(parts) and not parts[0].startswith("."):
            files.append(path)
    return files


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).parent.parts)


def forbidden_imports(files: Iterable[Path], forbidden: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
    prefixes, exceptions = tuple(forbidden), tuple(allowed)
    return [
        f"{path.relative_to(ROOT)}:{imp.line} imports {imp.module}"
        for path in files
        for imp in imports(path.read_text(encoding="utf-8"), package_of(path))
        if is_within(imp.module, prefixes) and not is_within(imp.module, exceptions)
    ]


# --- the checker sees every form -------------------------------------------------------------

IMPORT_FORMS = """\
import os
import mlx.core as mx
from socket import create_connection
def lazy():
    import asyncio
    from nats.aio import client
class Shell:
    def start(self):
        if True:
            from .. import service
            from ..flight.recorder import FlightRecorder
            from . import plan
try:
    import importlib
    importlib.import_module("threading")
    __import__("subprocess")
except ImportError:
    pass
"""


def test_the_checker_sees_every_import_form() -> None:
    found = {(imp.line, imp.module) for imp in imports(IMPORT_FORMS, "runner.engine")}
    assert {
        (1, "os"),
        (2, "mlx.core"),
        (3, "socket"),
        (5, "asyncio"),
        (6, "nats.aio"),
        (10, "runner.service"),
        (11, "runner.flight.recorder"),
        (12, "runner.engine.plan"),
        (15, "threading"),
        (16, "subprocess"),
    } <= found
    assert (6, "nats.aio.client") in found  # `from a import b`: b may be a module


def test_prefixes_match_whole_package_names() -> None:
    assert is_within("mlx.core", MLX) and is_within("mlx_lm", MLX) and is_within("mlx", MLX)
    assert not is_within("mlxx", MLX) and not is_within("mlx_whisper", MLX)
    assert is_within("runner.flight.recorder", ENGINE_MAY_NOT_IMPORT)
    assert not is_within("runner.engine.plan", ENGINE_MAY_NOT_IMPORT)
    assert not is_within("runner.models.shard", ENGINE_MAY_NOT_IMPORT)
    assert not is_within("osx", ENGINE_MAY_NOT_IMPORT) and not is_within("iofile", ENGINE_MAY_NOT_IMPORT)


def test_each_rule_catches_its_forbidden_forms() -> None:
    def hits(source: str, package: str, forbidden: tuple[str, ...]) -> set[str]:
        return {imp.module for imp in imports(source, package) if is_within(imp.module, forbidden)}

    events = "import threading\ndef f():\n    from eventlog.log import Log\n    import nats\n"
    assert hits(events, "events", EVENTS_MAY_NOT_IMPORT) == {"threading", "eventlog.log", "eventlog.log.Log", "nats"}
    engine = hits(IMPORT_FORMS, "runner.engine", ENGINE_MAY_NOT_IMPORT)
    assert engine == {
        *("os", "socket", "socket.create_connection", "asyncio", "nats.aio", "nats.aio.client", "threading"),
        *("runner.service", "runner.flight.recorder", "runner.flight.recorder.FlightRecorder", "subprocess"),
    }  # not runner.engine.plan, runner or mlx.core
    writes = "from pathlib import Path\nfrom events.catalogue import X\nimport logging\n"
    assert hits(writes, "runner.engine", ENGINE_MAY_NOT_IMPORT) == {
        *("pathlib", "pathlib.Path", "events.catalogue", "events.catalogue.X", "logging"),
    }
    lazy = "def f():\n    from services.ops import scan\n"
    assert hits(lazy, "runner", RUNNER_MAY_NOT_IMPORT) == {"services.ops", "services.ops.scan"}
    assert hits("from mlx_lm import load\n", "services", MLX) == {"mlx_lm", "mlx_lm.load"}


def test_the_checker_sees_bare_io_calls_only() -> None:
    source = "def f(path, mx):\n    open(path).read()\n    print('x')\n    path.open()\n    mx.eval(1)\n"
    assert calls_to(source, ENGINE_MAY_NOT_CALL) == [(2, "open"), (3, "print")]


# --- the rules ---------------------------------------------------------------------------------


def test_events_does_no_io() -> None:
    files = python_files("events")
    assert files, "no events/ package found"
    offenders = forbidden_imports(files, EVENTS_MAY_NOT_IMPORT)
    assert offenders == [], f"events/ is the pure vocabulary; move I/O to eventlog/ or a service: {offenders}"


def test_mlx_is_imported_only_under_runner() -> None:
    files = [p for p in python_files() if p.relative_to(ROOT).parts[0] not in MAY_IMPORT_MLX]
    assert {"events", "services", "eventlog"} <= {p.relative_to(ROOT).parts[0] for p in files}
    offenders = forbidden_imports(files, MLX)
    assert offenders == [], f"mlx imported outside runner/ (docs/ARCHITECTURE.md §1): {offenders}"


def test_runner_engine_does_no_io() -> None:
    files = python_files("runner/engine")
    assert any(p.name == "engine.py" for p in files)
    offenders = forbidden_imports(files, ENGINE_MAY_NOT_IMPORT, ENGINE_MAY_IMPORT_ANYWAY)
    offenders += [
        f"{path.relative_to(ROOT)}:{line} calls {name}()"
        for path in files
        for line, name in calls_to(path.read_text(encoding="utf-8"), ENGINE_MAY_NOT_CALL)
    ]
    assert offenders == [], f"runner/engine/ does no I/O; do it in a shell (local/, service/, flight/): {offenders}"


def test_runner_never_imports_services() -> None:
    files = python_files("runner")
    assert any(p.parts[-2] == "service" for p in files)
    offenders = forbidden_imports(files, RUNNER_MAY_NOT_IMPORT)
    assert offenders == [], f"runner/ must not depend on services/ (the services spawn runners): {offenders}"


def runner_modules_imported_by(under: str) -> list[str]:
    """The `runner` modules (not names in them) that files under `under` import, lazily or not."""
    found = {
        imp.module
        for path in python_files(under)
        for imp in imports(path.read_text(encoding="utf-8"), package_of(path))
        if is_within(imp.module, ("runner",))
    }
    return sorted(m for m in found if (ROOT / (m.replace(".", "/") + ".py")).exists())


def test_services_use_only_runner_modules_that_load_no_mlx() -> None:
    """The API, the worker and the CLI share what they must with the runner (settings' types, BLAS
    and CPU placement, model facts and chat templates, the local launcher) without loading MLX:
    a process that serves HTTP or supervises runners never pays for it."""
    shared = runner_modules_imported_by("services")
    assert {"runner.blas", "runner.models.model_info", "runner.local.launch"} <= set(shared)
    probe = f"import sys\nfor m in {shared!r}: __import__(m)\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", f"importing {shared} loads MLX: {done.stdout}"
