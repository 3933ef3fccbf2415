"""Links between nodes, measured by their workers: each worker answers probes on a port of its own
(announced in `NodeJoined.link_probe_port`) and measures its link to every other node that is up,
when it joins and every `link_measure_seconds`, as `LinkMeasured` events (round trip of one byte,
and the rate of a 1 MiB send). The master orders an instance's ring along the fastest links
(`services/master/ring.py`).

The probe protocol is two requests on one connection, each bounded: `p` is answered with `p` (a
round trip); `t` and an 8-byte big-endian length up to `MAX_BULK_BYTES` is answered with `t` once
that many bytes arrived. Anything else closes the connection.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import msgspec
from loguru import logger

from events.ids import NodeId
from events.state import State

BULK_BYTES = 1 << 20
MAX_BULK_BYTES = 4 << 20
PINGS = 5
PROBE_TIMEOUT_SECONDS = 5.0


class LinkSample(msgspec.Struct, frozen=True, kw_only=True):
    rtt_us: int
    bytes_per_second: int


async def serve_probes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One prober's connection: answer its requests until it closes or says something else."""
    try:
        while True:
            kind = await asyncio.wait_for(reader.read(1), PROBE_TIMEOUT_SECONDS)
            if kind == b"p":
                writer.write(b"p")
            elif kind == b"t":
                size = int.from_bytes(await asyncio.wait_for(reader.readexactly(8), PROBE_TIMEOUT_SECONDS))
                if size > MAX_BULK_BYTES:
                    return
                await asyncio.wait_for(reader.readexactly(size), PROBE_TIMEOUT_SECONDS)
                writer.write(b"t")
            else:
                return
            await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()


async def measure_link(host: str, port: int) -> LinkSample:
    """The median round trip of `PINGS` one-byte messages and the rate of one `BULK_BYTES` send."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT_SECONDS)
    try:
        trips: list[float] = []
        for _ in range(PINGS):
            started = time.perf_counter()
            writer.write(b"p")
            await writer.drain()
            await asyncio.wait_for(reader.readexactly(1), PROBE_TIMEOUT_SECONDS)
            trips.append(time.perf_counter() - started)
        started = time.perf_counter()
        writer.write(b"t" + BULK_BYTES.to_bytes(8) + bytes(BULK_BYTES))
        await writer.drain()
        await asyncio.wait_for(reader.readexactly(1), PROBE_TIMEOUT_SECONDS)
        bulk = time.perf_counter() - started
    finally:
        writer.close()
    return LinkSample(rtt_us=int(statistics.median(trips) * 1e6), bytes_per_second=int(BULK_BYTES / max(bulk, 1e-9)))


def peers_to_measure(state: State, node_id: str) -> list[tuple[NodeId, str, int]]:
    """(peer, host, probe port) of every other node that is up and answers probes."""
    return sorted(
        (node.node_id, node.host, node.link_probe_port)
        for node in state.nodes.values()
        if node.status == "up" and node.node_id != node_id and node.link_probe_port
    )


async def measure_links_forever(
    node_id: str,
    current_state: Callable[[], State],
    report: Callable[[NodeId, LinkSample], Awaitable[None]],
    interval_seconds: float,
) -> None:
    """Measure every peer's link now and every `interval_seconds`; a peer that does not answer is
    skipped (its node's liveness is the master's business) and tried again next round."""
    while True:
        for peer, host, port in peers_to_measure(current_state(), node_id):
            try:
                sample = await measure_link(host, port)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                logger.debug("link {} -> {} not measured: {!r}", node_id, peer, exc)
                continue
            await report(peer, sample)
        await asyncio.sleep(interval_seconds)
