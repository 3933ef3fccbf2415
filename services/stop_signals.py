"""Stop a service the way Ctrl-C does, whoever asks: SIGINT (Ctrl-C), SIGTERM (systemd, docker,
kill) and SIGHUP (its terminal closed) all cancel the running coroutine, so its clean-up runs — a
worker records `NodeLeft` and stops its runners, `shoal up` stops its services and then its
embedded NATS. Without this SIGTERM and SIGHUP ended the process on the spot: the master learnt of
a stopped worker only at its node timeout, and `shoal up` left its nats-server running."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from typing import TypeVar

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

T = TypeVar("T")


async def until_stopped(work: Awaitable[T]) -> T | None:
    """`work`'s result, or None once a stop signal cancelled it (and its clean-up ran)."""
    main = asyncio.current_task()
    assert main is not None, "until_stopped runs in a task"
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, main.cancel)
    try:
        return await work
    except asyncio.CancelledError:
        if main.cancelling() == 0:
            raise
        main.uncancel()
        return None
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
