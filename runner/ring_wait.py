"""Wait for the left ring neighbour without spinning: the blocking wait mlx's ring backend lacks.

mlx's ring backend (0.32) moves bytes with one thread per socket that, while any send or receive
is queued, loops on non-blocking `recv`/`send` calls. A rank waiting in a receive or an all-reduce
therefore burns a whole core until its peer's bytes come: measured, rank 0 of two spends 1.0 s of
CPU in a 1 s wait for its peer's all-reduce. Where the ranks share a host's cores (two ranks on
two cores) that thread takes the core the computing rank, the API or NATS needs.

`RingInbound.wait` blocks in `poll` (no CPU, the GIL released) until bytes are readable on the
socket a rank receives on (every receive of the engine is from its left neighbour: activations
from rank r-1, the agreement's messages in `runner.engine.collectives`), so the receive that
follows finds its data there and spins for microseconds. It never reads a byte, so it cannot
change what the receive gets, and `limit_seconds` bounds each wait: a wrong guess only costs the
old spin.

The socket is the group's own, found among the process's descriptors by address: the connection
accepted on this rank's ring port (mlx receives from the left neighbour on it). It is duplicated,
so polling never changes the backend's socket.
"""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Iterable, Sequence

WAIT_LIMIT_SECONDS = 2.0  # past this a wait gives up and the receive spins, as without it


def _host_port(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    return socket.gethostbyname(host), int(port)


def _open_descriptors() -> list[int]:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return sorted(int(name) for name in os.listdir(folder))
        except OSError:
            continue
    return []


def accepted_on(descriptors: Iterable[int], address: tuple[str, int]) -> list[socket.socket]:
    """Duplicates of the connected TCP sockets whose local end is `address` (ip, port)."""
    found: list[socket.socket] = []
    for fd in descriptors:
        if any(fd == kept.fileno() for kept in found):
            continue  # a duplicate this search made, which took a number later in the list
        try:
            duplicate = os.dup(fd)
        except OSError:
            continue  # closed meanwhile
        try:
            candidate = socket.socket(fileno=duplicate)
        except OSError:
            os.close(duplicate)  # not a socket: the duplicate is ours to close
            continue
        try:
            candidate.getpeername()  # connected, not a listener
            matches = candidate.type == socket.SOCK_STREAM and candidate.getsockname()[:2] == address
        except (OSError, TypeError, IndexError):  # unconnected, or not an inet socket
            matches = False
        if matches:
            found.append(candidate)
        else:
            candidate.close()
    return found


class RingInbound:
    """The rank's inbound ring socket(s), polled for readable bytes."""

    def __init__(self, sockets: Sequence[socket.socket], limit_seconds: float = WAIT_LIMIT_SECONDS) -> None:
        self._sockets = list(sockets)  # kept open: the duplicates live as long as the group
        self._poll = select.poll()
        for sock in self._sockets:
            self._poll.register(sock.fileno(), select.POLLIN)
        self._limit_ms = int(limit_seconds * 1000)

    @classmethod
    def find(cls, ring_hosts: Sequence[str], rank: int) -> RingInbound:
        """After the group is up; `ring_hosts`: the hostfile's `host:port` per rank."""
        return cls(accepted_on(_open_descriptors(), _host_port(ring_hosts[rank])))

    @property
    def found(self) -> int:
        return len(self._sockets)

    def wait(self) -> None:
        """Until bytes (or the peer's hang-up) are readable, or the limit passed; at once when
        there is no socket to watch."""
        self.readable(self._limit_ms / 1000)

    def readable(self, timeout_seconds: float) -> bool:
        """Whether bytes (or the peer's hang-up) became readable within `timeout_seconds`; True at
        once when there is no socket to watch."""
        return not self._sockets or bool(self._poll.poll(int(timeout_seconds * 1000)))

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()
