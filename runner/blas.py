"""Which BLAS the rank processes get, and how many threads each.

On Linux CPU `mlx[cpu]` links a reference BLAS (~6 GFLOPS here); a system OpenBLAS preloaded
with LD_PRELOAD gives ~220 GFLOPS. Ranks on one node share its cores: while they compute at once
(an overlapped prefill, the decode ring) each takes an equal share of the cores, otherwise they
oversubscribe and the overlap is lost; while one computes and the others wait for it (a lockstep
decode step goes through the ranks one after another) it takes every core (`BlasThreads`: a
2-rank qwen3 of 100M parameters on two shared cores decoded one stream at 16 tok/s on a core
each, 23 tok/s on both). The pool then holds every core's thread, and ranks sharing a node let an
idle thread spin ~1.6 ms before it sleeps (`OPENBLAS_THREAD_TIMEOUT` 22: 2**22 cycles), through
the gaps between one forward's products but not through another rank's turn: OpenBLAS's own
~0.1 s took the core from the rank computing meanwhile (that qwen3, 16 streams in lockstep: 128
tok/s; sleeping at once, 2**4 cycles, ~188; at 2**22 ~198, against ~208 on one rank). A rank
alone on its node keeps OpenBLAS's spin: it has no one to take the core from, and waking a
sleeping thread for every product costs it more (tiny, 16 streams: ~1,340 tok/s spinning, ~1,100
sleeping at once).
"""

from __future__ import annotations

import ctypes
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
    "off" (touch nothing), or a path to a BLAS shared library. Unless the caller's environment
    pins OPENBLAS_NUM_THREADS, the pool gets every core's thread and the rank its share of them for
    when the ranks on its node compute at once (`SHOAL_BLAS_SHARE`, switched by `BlasThreads`).
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
    if "OPENBLAS_NUM_THREADS" not in base_env:  # pinned by the caller: left as it is, never switched
        env["OPENBLAS_NUM_THREADS"] = str(max(1, cpu_count))  # the pool: every core's thread
        env[BLAS_SHARE_ENV] = str(threads_per_rank(ranks_on_node, cpu_count))
        if ranks_on_node > 1 and "OPENBLAS_THREAD_TIMEOUT" not in base_env:
            env["OPENBLAS_THREAD_TIMEOUT"] = SHARED_NODE_SPIN
    return env


BLAS_SHARE_ENV = "SHOAL_BLAS_SHARE"  # a rank's threads while the ranks on its node compute at once
SHARED_NODE_SPIN = "22"  # 2**22 cycles (~1.6 ms) of spin before an idle thread sleeps, on a shared node


def threads_per_rank(ranks_on_node: int, cpu_count: int) -> int:
    return max(1, cpu_count // max(1, ranks_on_node))


class BlasThreads:
    """A rank's OpenBLAS threads, switched between its `share` (`overlapping`: the ranks on its
    node compute at once) and the pool's `every` thread (it computes while they wait). A no-op
    without a preloaded OpenBLAS, or with the thread count pinned (`blas_env` then sets no share).
    The count changes how a product is split between threads, never an element's sum: each output
    element is one thread's, over the same inner loop, so the tokens are the same either way."""

    def __init__(self, every: int, share: int, set_threads: Callable[[int], object] | None) -> None:
        self.every, self.share = max(1, every), max(1, min(share, every))
        self._set_threads = set_threads if self.share < self.every else None
        self.threads: int | None = None  # as last set here (None: the pool's own count, `every`)

    @classmethod
    def at_share(cls, env: Mapping[str, str]) -> BlasThreads:
        """A process spawned by `blas_env` starts at its share (the pool holds every core's thread,
        made before any thread is pinned): the first thing a rank does, before it computes."""
        threads = cls.from_env(env)
        threads.overlapping(True)
        return threads

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BlasThreads:
        every = _count(env.get("OPENBLAS_NUM_THREADS"))
        share = _count(env.get(BLAS_SHARE_ENV))
        if every is None or share is None:
            return cls(1, 1, None)
        return cls(every, share, _openblas_setter())

    def overlapping(self, at_once: bool) -> None:
        threads = self.share if at_once else self.every
        if self._set_threads is not None and threads != self.threads:
            self._set_threads(threads)
            self.threads = threads


def _count(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() and int(value) > 0 else None


def _openblas_setter() -> Callable[[int], object] | None:
    """OpenBLAS's `openblas_set_num_threads`, when the process has it (preloaded); else None."""
    try:
        return ctypes.CDLL(None).openblas_set_num_threads
    except (AttributeError, OSError):
        return None
