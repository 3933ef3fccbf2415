"""A NATS store out of disk space (issue 46): appends fail with a message that says so, nothing
acknowledged is lost, and the embedded server writes again by itself once space returns.

The store lives on a small tmpfs (root only: the test mounts and unmounts it), filled by a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.log import EventLog
from eventlog.publish import LogUnreachable
from eventlog.streams import LogSettings, StreamLimits
from events.catalogue import LogEvent
from events.synthetic import synthetic_history
from services.nats import EmbeddedNats
from services.nats_keeper import keep_running

MIB = 1 << 20
BATCH = 500


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(path: Path) -> None:
    """Write `path` until its filesystem is full."""
    chunk = b"\0" * MIB
    with path.open("wb") as filler, contextlib.suppress(OSError):
        while True:
            filler.write(chunk)
            filler.flush()


@pytest.mark.timeout(120)
async def test_a_full_store_fails_appends_saying_so_then_resumes_by_itself_losing_nothing_acknowledged(
    small_disk: Path,
) -> None:
    server = EmbeddedNats(data_dir=small_disk / "store", port=0).start()
    keeper = asyncio.create_task(keep_running(server, poll_seconds=0.1, room_bytes=4 * MIB))
    unlimited = StreamLimits(max_age_seconds=3600.0)  # a stream's byte limit is reserved up front
    settings = LogSettings(events=unlimited, telemetry=unlimited, retry_seconds=3.0)
    events = synthetic_history(40 * BATCH)
    acknowledged: list[LogEvent] = []
    try:
        log = await EventLog.connect(server.url, settings)
        try:
            acknowledged += events[:BATCH]
            await log.append_many(events[:BATCH])
            fill(small_disk / "filler")
            refused: LogUnreachable | None = None
            for start in range(BATCH, len(events), BATCH):  # until the server fails to write one
                try:
                    await log.append_many(events[start : start + BATCH])
                except LogUnreachable as exc:
                    refused = exc
                    break
                acknowledged += events[start : start + BATCH]
            assert refused is not None, "the full disk never refused a write"
            assert "out of disk space" in str(refused)
            assert server.store_full()
            (small_disk / "filler").unlink()  # space returns: the keeper restarts the server
            after = events[-1]
            async with asyncio.timeout(60):
                while True:
                    try:
                        await log.append(after)
                        break
                    except LogUnreachable:
                        continue
            stored = [event async for _, event in log.replay()]
        finally:
            await log.close()
        at = {event.env.event_id: index for index, event in enumerate(stored)}
        assert all(event.env.event_id in at for event in acknowledged), "an acknowledged event was lost"
        assert [at[event.env.event_id] for event in acknowledged] == sorted(at[e.env.event_id] for e in acknowledged)
        assert stored[-1] == after
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        server.stop()
