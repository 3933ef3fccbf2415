"""Which BLAS the rank processes get, and how many threads each (pure, testable).

On Linux CPU `mlx[cpu]` links a reference BLAS (~6 GFLOPS here); a system OpenBLAS preloaded
with LD_PRELOAD gives ~220 GFLOPS. Ranks on one node share its cores, so each gets an equal
share of OpenBLAS threads, otherwise they oversubscribe and the overlap is lost.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Annotated

import msgspec

BlasSetting = Annotated[
    str,
    msgspec.Meta(
        pattern=r"\S",
        extra={"allowed": "auto, off, or the path of a BLAS library"},
        description="BLAS of the runners on CPU",
    ),
]

SYSTEM_OPENBLAS_PATHS: tuple[str, ...] = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


class BlasSettingError(ValueError):
    """SHOAL_BLAS names a file that does not exist."""


def blas_env(
    setting: str | None,
    ranks_on_node: int,
    cpu_count: int,
    base_env: Mapping[str, str],
    exists: Callable[[str], bool] = os.path.exists,
) -> dict[str, str]:
    """Environment additions for one rank process.

    `setting` is SHOAL_BLAS: "auto" (default; preload the first system OpenBLAS found),
    "off" (touch nothing), or a path to a BLAS shared library. The result always splits
    OPENBLAS_NUM_THREADS unless the caller's environment already pins it.
    """
    choice = (setting or "auto").strip()
    env: dict[str, str] = {}
    if choice.lower() == "off":
        return env
    if choice.lower() == "auto":
        library = next((path for path in SYSTEM_OPENBLAS_PATHS if exists(path)), None)
    else:
        if not exists(choice):
            raise BlasSettingError(f"SHOAL_BLAS={choice!r}: no such file; use auto, off or a library path")
        library = choice
    if library is not None:
        existing = base_env.get("LD_PRELOAD", "")
        parts = [library, *[p for p in existing.split(":") if p and p != library]]
        env["LD_PRELOAD"] = ":".join(parts)
    if "OPENBLAS_NUM_THREADS" not in base_env:
        env["OPENBLAS_NUM_THREADS"] = str(threads_per_rank(ranks_on_node, cpu_count))
    return env


def threads_per_rank(ranks_on_node: int, cpu_count: int) -> int:
    return max(1, cpu_count // max(1, ranks_on_node))
