"""Measuring in a freshly spawned interpreter, so a figure (peak or resident memory, start-up
time) is the measured action's own, not inherited from the bench process's earlier work."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

RESULT_TIMEOUT_S = 300.0


def in_fresh_process(target: Callable[..., None], *args: Any) -> Any:
    """Run `target(*args, results)` in a spawned child; what it put on `results` (a queue)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=target, args=(*args, results))
    child.start()
    out = results.get(timeout=RESULT_TIMEOUT_S)
    child.join(timeout=60)
    return out
