"""The supervisor: its backoff policy alone, then the shell on a fake clock and fake sleep."""

from __future__ import annotations

import asyncio

import pytest

from services.config import ConfigError
from services.supervise import Backoff, ServiceHealth, supervise

POLICY = Backoff(initial_seconds=0.5, max_seconds=30.0, healthy_seconds=60.0)


@pytest.mark.parametrize(("failures", "seconds"), [(0, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (500, 30.0)])
def test_delay_doubles_from_half_a_second_to_thirty(failures: int, seconds: float) -> None:
    assert POLICY.delay(failures) == seconds


@pytest.mark.parametrize(("failures", "ran", "after"), [(0, 0.1, 1), (3, 59.9, 4), (9, 60.0, 1), (9, 3600.0, 1)])
def test_a_healthy_run_resets_the_count(failures: int, ran: float, after: int) -> None:
    assert POLICY.failures_after(failures, ran) == after


class Script:
    """A service that fails as told on each start (None: run until cancelled), on a fake clock."""

    def __init__(self, runs: list[tuple[float, BaseException | str | None]]) -> None:
        self.runs = runs
        self.now = 0.0
        self.waits: list[float] = []
        self.degraded_while_waiting: list[bool] = []
        self.health = ServiceHealth()
        self.forever = asyncio.Event()  # never set: a healthy run lasts until cancelled

    async def run(self) -> None:
        lasted, outcome = self.runs.pop(0)
        self.now += lasted
        if outcome is None:
            await self.forever.wait()
        elif isinstance(outcome, BaseException):
            raise outcome
        # else: return, as a follow that ended would

    async def sleep(self, seconds: float) -> None:
        self.degraded_while_waiting.append(self.health.degraded)
        self.waits.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


async def _supervise(script: Script, fatal: tuple[type[Exception], ...] = ()) -> None:
    await supervise(
        "svc",
        script.run,
        backoff=POLICY,
        health=script.health,
        sleep=script.sleep,
        clock=lambda: script.now,
        fatal=fatal,
    )


async def test_failures_back_off_and_a_healthy_run_resets_the_backoff() -> None:
    boom = RuntimeError("refused write")
    script = Script([(1, boom), (1, boom), (1, boom), (120, boom), (1, boom), (0, None)])
    task = asyncio.create_task(_supervise(script))
    while script.runs:
        await asyncio.sleep(0)
    assert script.waits == [0.5, 1.0, 2.0, 0.5, 1.0]
    assert all(script.degraded_while_waiting) and not script.health.degraded  # running again
    assert "refused write" in script.health.last_error
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # cancellation (Ctrl-C) is never swallowed


async def test_a_service_that_returns_is_restarted_too() -> None:
    script = Script([(1, "return"), (0, None)])
    task = asyncio.create_task(_supervise(script))
    while script.runs:
        await asyncio.sleep(0)
    assert script.waits == [0.5] and "ended" in script.health.last_error
    task.cancel()


@pytest.mark.parametrize("grouped", [False, True])
async def test_a_fatal_error_is_raised_not_retried(grouped: bool) -> None:
    mistake = ConfigError("api_keys_file", "/nope", "flag", "a readable file")
    script = Script([(1, ExceptionGroup("group", [mistake]) if grouped else mistake)])
    with pytest.raises((ConfigError, ExceptionGroup)):
        await _supervise(script, fatal=(ConfigError,))
    assert script.waits == []


class ConvertsCancellation:
    """A service whose clean-up on cancel raises another error (nats-py: "Connection lost" while
    closing a connection to a server that is gone), or returns as if it had ended."""

    def __init__(self, on_cancel: Exception | None) -> None:
        self.on_cancel = on_cancel
        self.starts = 0
        self.running = asyncio.Event()

    async def run(self) -> None:
        self.starts += 1
        self.running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.on_cancel is not None:
                raise self.on_cancel from None


@pytest.mark.parametrize("on_cancel", [ConnectionResetError("Connection lost"), None])
async def test_a_cancel_the_service_turns_into_an_error_or_a_return_still_ends_the_supervisor(
    on_cancel: Exception | None,
) -> None:
    service = ConvertsCancellation(on_cancel)
    task = asyncio.create_task(supervise("svc", service.run, backoff=POLICY))
    await asyncio.wait_for(service.running.wait(), 5)
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.done(), "the supervisor restarted its service instead of stopping"  # Ctrl-C ignored
    assert task.cancelled() and service.starts == 1
