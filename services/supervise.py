"""Keep a service running: one that fails is logged and started again after a backoff, while
the services next to it keep serving.

`Backoff` is the pure policy (how long to wait before the next start, given how long the last run
lasted); `supervise` is the thin shell that runs a service under it. `shoal up` supervises its
master, each worker and the API this way, and the standalone `shoal master|worker|api` commands
their one service, so a NATS outage, a refused write or a bug in one event costs a restart, not
the process (docs/ARCHITECTURE.md §5).

Cancellation is never caught: Ctrl-C or SIGTERM cancels the task group the supervisors run in, and
each supervisor ends with its service, also when the service's own clean-up turned the cancellation
into another error (a connection lost while closing) or swallowed it: the task still carries the
request to cancel, and no restart follows one.

Each start runs in a task of its own, so that request is only ever a real one. On Python 3.11 (3.11.7
and 3.12.1 checked; 3.13.0 takes it back) a task group whose child fails while its parent task waits
in the group's `async with` exit cancels the parent to wake it and never takes that cancellation
back: the parent's `cancelling()` stays 1. A worker's live follow is such a group (`follow_families`,
awaited to the end of `Worker.run`), so a failed read there left the task the worker ran in (the
supervisor's own, then) looking as if Ctrl-C had asked it to stop: the worker said
`NodeLeft(shutdown)` and its process exited 0 instead of starting again (issue 46's chaos run). The leaked count now dies with the
start's own task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import cast

import msgspec
from loguru import logger


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """Exponential backoff between restarts: `initial_seconds`, doubling up to `max_seconds`; a
    run that lasted `healthy_seconds` or more was healthy, so the next failure starts over."""

    initial_seconds: float = 0.5
    max_seconds: float = 30.0
    healthy_seconds: float = 60.0

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1 = the first)."""
        if failures <= 0:
            return 0.0
        return min(self.initial_seconds * 2.0 ** min(failures - 1, 62), self.max_seconds)

    def failures_after(self, failures: int, ran_seconds: float) -> int:
        """The count of failures in a row once a run of `ran_seconds` failed."""
        return 1 if ran_seconds >= self.healthy_seconds else failures + 1


class ServiceHealth:
    """Whether a supervised service is running or waiting to restart, for a health check to read
    (the API's `/healthz` reports its log follow's)."""

    def __init__(self) -> None:
        self.degraded = False
        self.last_error = ""

    def failed(self, error: str) -> None:
        self.degraded, self.last_error = True, error

    def running(self) -> None:
        self.degraded = False


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    backoff: Backoff | None = None,
    fatal: tuple[type[Exception], ...] = (),
    health: ServiceHealth | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run `run()` until cancelled, starting it again after each failure (an exception, or a
    return: a service runs until cancelled, so one that ends has lost its log). An exception of a
    `fatal` type (a configuration mistake no retry cures), alone or in a task group's exception
    group, is raised instead."""
    policy = backoff or Backoff()
    health = health or ServiceHealth()
    failures = 0
    while True:
        started = clock()
        health.running()
        try:
            await asyncio.create_task(_awaited(run()), name=name)  # a task of its own: see the module's doc
            error = "it ended (its log follow stopped)"
        except Exception as exc:  # any failure of one service costs a restart, not the process
            if _carries(exc, fatal):
                raise
            _stop_if_cancelled(exc)
            logger.opt(exception=exc).debug("{} failed", name)
            error = describe(exc)
        _stop_if_cancelled(None)
        failures = policy.failures_after(failures, clock() - started)
        wait = policy.delay(failures)
        health.failed(error)
        logger.warning("{} is degraded: {}; restarting in {:g}s (failure {} in a row)", name, error, wait, failures)
        await sleep(wait)


async def _awaited(work: Awaitable[None]) -> None:
    await work


def _stop_if_cancelled(cause: Exception | None) -> None:
    """End the supervisor when its task was asked to stop, whatever the service made of that."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from cause


def _carries(exc: BaseException, kinds: tuple[type[Exception], ...]) -> bool:
    if isinstance(exc, kinds):
        return True
    if isinstance(exc, BaseExceptionGroup):
        inners = cast("tuple[BaseException, ...]", exc.exceptions)
        return any(_carries(inner, kinds) for inner in inners)
    return False


def describe(exc: BaseException) -> str:
    """`Type: message` of the error, or of each error a task group carried."""
    if isinstance(exc, BaseExceptionGroup):
        inners = cast("tuple[BaseException, ...]", exc.exceptions)
        return "; ".join(describe(inner) for inner in inners)
    return f"{type(exc).__name__}: {exc}"
