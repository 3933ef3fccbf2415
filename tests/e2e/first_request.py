"""What a test's first request to an API it started in its own event loop found, when it failed.

`test_healthz_says_degraded_with_503_...` failed twice in full suites (once on CI: `ConnectError`;
once here: `ReadTimeout` after 5 s), never alone, right after the API logged that it listens. This
says what was there at that moment: the sockets on the port (`ss`), whether this event loop still
runs its callbacks promptly, its tasks, the descriptors its selector watches, and where every
thread of the test process stands. (A third failure, here: the API had accepted the connection,
the 151 bytes of the request sat unread in its socket, and the loop yielded at once.)
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
import time
import traceback

import httpx


async def get_or_diagnose(http: httpx.AsyncClient, path: str, port: int) -> httpx.Response:
    """`GET path`; a transport failure is re-raised with what the port and process looked like."""
    try:
        return await http.get(path)
    except httpx.TransportError as exc:
        raise AssertionError(f"GET {path} on port {port} failed: {exc!r}\n{await diagnosis(port)}") from exc


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
    return lines
