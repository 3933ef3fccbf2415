"""What a test's first request to an API it started in its own event loop found, when it failed.

`test_healthz_says_degraded_with_503_...` failed four times in full suites, never alone, right
after the API logged that it listens (see `get_or_diagnose`). This says what was there at that
moment: the sockets on the port (`ss`), whether this event loop still runs its callbacks promptly,
its tasks, the descriptors its selector watches against those the kernel's epoll watches, and
where every thread of the test process stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import shutil
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

import httpx

SLOW_SECONDS = 5.0  # what the test's client once allowed: a first request slower than this is reported


async def get_or_diagnose(http: httpx.AsyncClient, path: str, port: int, timeout: float = 10.0) -> httpx.Response:
    """`GET path`, allowing `timeout` (less than the API's 15 s header deadline, so a connection
    whose request is never read is still open to look at). A transport failure is reported as a
    warning saying what the port, the loop and its epoll looked like, then the request is made
    once more on a new connection, whose failure fails the test; an answer slower than
    `SLOW_SECONDS` is reported with the longest stall of this event loop and the collections.

    Four failures in full suites so far, never alone: the API accepted the connection and its
    protocol armed the header deadline, but the request's bytes sat unread in the socket while
    the loop ran promptly, until the deadline closed it (ReadError after 15 s) or the client gave
    up (ReadTimeout, 5 s); once a ConnectError. A socket whose reader the selector lists but the
    kernel's epoll does not watch would do that: the diagnosis compares the two."""
    try:
        return await _timed_get(http, path, timeout)
    except httpx.TransportError as exc:
        said = f"GET {path} on port {port} failed: {exc!r}\n{await diagnosis(port)}"
        warnings.warn(said, stacklevel=2)
    return await _timed_get(http, path, 30.0)


async def _timed_get(http: httpx.AsyncClient, path: str, timeout: float) -> httpx.Response:
    stalls = _StallWatch()
    started = time.monotonic()
    try:
        response = await http.get(path, timeout=timeout)
    except httpx.TransportError as exc:
        exc.add_note(stalls.stop())
        raise
    took = time.monotonic() - started
    watched = stalls.stop()
    if took > SLOW_SECONDS:
        warnings.warn(f"GET {path} took {took:.1f} s; {watched}", stacklevel=3)
    return response


class _StallWatch:
    """The longest gap between this loop's 10 ms ticks, and the garbage collections meanwhile."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.collections: list[tuple[int, float]] = []  # (generation, seconds)
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            self.longest = max(self.longest, time.monotonic() - before - 0.01)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.collections.append((info["generation"], time.perf_counter() - self._gc_started))

    def stop(self) -> str:
        self._ticker.cancel()
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        slowest = max(self.collections, key=lambda c: c[1], default=(0, 0.0))
        return (
            f"the loop's longest stall {self.longest * 1000:.0f} ms; {len(self.collections)} collections, "
            f"the slowest (generation {slowest[0]}) {slowest[1] * 1000:.0f} ms"
        )


async def diagnosis(port: int) -> str:
    started = time.monotonic()
    await asyncio.sleep(0)
    lag_ms = (time.monotonic() - started) * 1000
    lines = [f"event loop: a yield took {lag_ms:.1f} ms; {len(asyncio.all_tasks())} tasks"]
    lines += [f"  task {task!r}"[:300] for task in asyncio.all_tasks()]
    lines += _watched_descriptors(asyncio.get_running_loop())
    ss = shutil.which("ss")
    if ss is not None:
        query = [ss, "-tanpe", f"( sport = :{port} or dport = :{port} )"]
        lines.append(subprocess.run(query, capture_output=True, text=True, timeout=10).stdout)
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():  # pyright: ignore[reportPrivateUsage]
        where = "".join(traceback.format_stack(frame, limit=4))
        lines.append(f"thread {names.get(ident, ident)}:\n{where}")
    return "\n".join(lines)


def _watched_descriptors(loop: asyncio.AbstractEventLoop) -> list[str]:
    """What this loop's selector watches, per descriptor: an accepted connection whose bytes sit
    unread (Recv-Q in `ss`) either has no reader here or one the loop never ran."""
    selector = getattr(loop, "_selector", None)
    if selector is None:
        return ["selector: none to read"]
    lines = ["selector (fd: events, reader | writer):"]
    for key in selector.get_map().values():
        reader, writer = key.data if isinstance(key.data, tuple) else (key.data, None)
        lines.append(f"  {key.fd}: {key.events} {reader!r} | {writer!r}"[:300])
    epoll = getattr(selector, "_selector", None)
    if epoll is not None:
        with contextlib.suppress(OSError, ValueError):
            info = Path(f"/proc/self/fdinfo/{epoll.fileno()}").read_text()
            watched = sorted(int(line.split()[1]) for line in info.splitlines() if line.startswith("tfd:"))
            lines.append(f"the kernel's epoll watches fds {watched}")
    return lines
