"""What one HTTP connection may hold of the API: its request's headers within a deadline, and
never the last file descriptor.

uvicorn closes an idle keep-alive connection, but a connection that sends part of a request's
headers and then nothing (slowloris) is held for ever: measured, 3,000 of them from one client
took every descriptor of `shoal up` (soft limit 2,048) and the API answered nobody, not even
/healthz, while asyncio logged "Too many open files" a million times. Here:
- `HeaderDeadline`: uvicorn's httptools protocol, closing a connection whose request headers are
  not complete `HEADER_DEADLINE_SECONDS` after it opened or after its previous response;
- a bound on the connections held at once (`connection_budget()`: the descriptor limit, raised
  to its hard limit, less what NATS, runners' pipes and files need): past it, a new connection
  closes the one that has waited longest for its headers (the new one itself if none waits), so
  a flood of silent connections cannot lock out the clients that talk;
- `TCP_NODELAY` on every connection: asyncio sets it only on sockets whose protocol number says
  TCP, which a listening socket made as `socket(AF_INET, SOCK_STREAM)` (or handed over by a
  service manager) does not; without it a response's body waited for the client's delayed ACK of
  its headers: 44 ms per request on a kept-alive connection, and on every streamed token.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from typing import cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_DEADLINE_SECONDS = 15.0  # to send a request's headers (nginx: client_header_timeout 60 s)
BODY_DEADLINE_SECONDS = 30.0  # to send its body, once the headers came (`task_stream.read_body`: 408)
# kept for what is not an HTTP connection, and for the connections asyncio accepts in one burst
# before the oldest silent ones are closed: a quarter of the limit, at least 256
RESERVED_SHARE, RESERVED_AT_LEAST = 4, 256
MAX_DESCRIPTORS = 1 << 16  # the soft limit is raised to at most this


class HeaderDeadline(HttpToolsProtocol):
    """A connection that takes longer than `deadline_seconds` to send its request's headers is
    closed; a request whose headers arrived in time may take as long as it needs. Past
    `max_connections`, the connection waiting longest for its headers makes room. Made per server
    by `guarded_protocol`."""

    deadline_seconds: float = HEADER_DEADLINE_SECONDS
    max_connections: int = 1 << 30
    waiting_since: float | None = None  # loop time since the headers are awaited; None: not waiting
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # the peer may be gone already
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._arm()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers, on a kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self.waiting_since = self.loop.time()
        self._header_deadline = self.loop.call_later(self.deadline_seconds, self._close)

    def _disarm(self) -> None:
        self.waiting_since = None
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _make_room(self) -> None:
        guarded = [cast("HeaderDeadline", c) for c in self.connections if isinstance(c, HeaderDeadline)]
        waiting = [(c.waiting_since, c) for c in guarded if c.waiting_since is not None]
        oldest = min(waiting, key=lambda pair: pair[0], default=(0.0, self))[1]
        oldest._close()  # pyright: ignore[reportPrivateUsage]  # same class

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(max_connections: int, deadline_seconds: float = HEADER_DEADLINE_SECONDS) -> type[HeaderDeadline]:
    """`HeaderDeadline` with this server's bounds (a class per server: nothing shared)."""
    return type(
        "GuardedHttpToolsProtocol",
        (HeaderDeadline,),
        {"max_connections": max_connections, "deadline_seconds": deadline_seconds},
    )


def connection_budget() -> int:
    """Raise this process's descriptor limit to its hard limit (at most `MAX_DESCRIPTORS`); the
    HTTP connections to serve at once, leaving a quarter (at least 256) for everything else."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MAX_DESCRIPTORS)
    if wanted > soft:
        with contextlib.suppress(ValueError, OSError):  # macOS refuses some values: keep the soft one
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(64, soft - max(RESERVED_AT_LEAST, soft // RESERVED_SHARE))
