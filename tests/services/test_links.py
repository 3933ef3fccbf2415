"""The workers' link probes over real sockets (services/worker/links.py): a measurement of a live
probe server, and hostile probes that only close their own connection."""

from __future__ import annotations

import asyncio

from services.worker.links import MAX_BULK_BYTES, measure_link, serve_probes


async def test_a_link_to_a_probe_server_is_measured() -> None:
    server = await asyncio.start_server(serve_probes, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        sample = await measure_link("127.0.0.1", port)
        again = await measure_link("127.0.0.1", port)  # the server serves the next prober too
    assert sample.rtt_us > 0 and sample.bytes_per_second > 0 and again.rtt_us > 0


async def test_a_hostile_probe_is_closed_and_the_server_keeps_answering() -> None:
    server = await asyncio.start_server(serve_probes, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        for hostile in (b"x", b"t" + (MAX_BULK_BYTES + 1).to_bytes(8)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(hostile)
            await writer.drain()
            assert await asyncio.wait_for(reader.read(1), 5) == b""  # closed, nothing answered
            writer.close()
        assert (await measure_link("127.0.0.1", port)).rtt_us > 0
