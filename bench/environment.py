"""What produced a figure: the commit, the machine, the versions and the BLAS, beside every result.

A figure without these cannot be checked: a ratio from another CPU, another mlx or another
commit is another figure. `capture()` is called by `shoal bench` before a bench runs and
`finish()` after it, so the load average on both sides of the run is in the JSON too.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from runner.blas import blas_env
from services.nats import NatsBinaryNotFound, find_nats_server

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = "bench/results"  # recording into it must not make the next run look "dirty"
PACKAGES = ("mlx", "mlx-lm", "nats-py", "msgspec")


def capture() -> dict[str, Any]:
    return {
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(REPO),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "load_avg_before": _load_avg(),
        "python": platform.python_version(),
        **{name: _version(name) for name in PACKAGES},
        "nats_server": nats_server_version(),
        "blas": blas_facts(),
    }


def finish(environment: dict[str, Any]) -> dict[str, Any]:
    return {**environment, "load_avg_after": _load_avg()}


def git_state(repo: Path) -> dict[str, Any]:
    """The commit and whether the tree differs from it (recorded results excepted)."""
    head = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain", "--", ".", f":(exclude){RESULTS_DIR}")
    return {"commit": head, "dirty": None if status is None else bool(status)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        brand = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
        if brand:
            return brand
    return platform.processor() or platform.machine()


def nats_server_version() -> str | None:
    try:
        binary = find_nats_server()
    except NatsBinaryNotFound:
        return None
    out = _run([binary, "--version"])
    return out.split()[-1] if out else None


def blas_facts() -> dict[str, Any]:
    """What a runner process spawned now would get: the SHOAL_BLAS setting and the library preloaded."""
    setting = os.environ.get("SHOAL_BLAS", "auto")
    added = blas_env(setting, 1, os.cpu_count() or 1, os.environ)
    return {
        "setting": setting,
        "preloaded": added.get("LD_PRELOAD", "").split(":")[0] or None,
        "openblas_num_threads_pinned": os.environ.get("OPENBLAS_NUM_THREADS"),
    }


def _load_avg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git(repo: Path, *args: str) -> str | None:
    out = _run(["git", "-C", str(repo), *args])
    return None if out is None else out.strip()


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout
