"""A connect that fails after the connection opened (the streams cannot be set up: JetStream off,
no meta leader yet, a refused permission) closes that connection: a service retrying its connect
under `supervise` must not leave one client per try reconnecting for ever."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from eventlog.log import EventLog, LogError
from services.nats import find_nats_server, free_port, read_info

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server_without_jetstream() -> Iterator[tuple[str, int]]:
    port, monitor = free_port(), free_port()
    process = subprocess.Popen(
        [find_nats_server(), "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while read_info("127.0.0.1", port) is None:
            assert time.monotonic() < deadline, "nats-server did not start"
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}", monitor
    finally:
        process.terminate()
        process.wait(timeout=10)


def _clients(monitor: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz", timeout=5) as answer:
        return int(json.load(answer)["num_connections"])


async def test_a_connect_whose_streams_cannot_be_set_up_closes_its_connection(
    server_without_jetstream: tuple[str, int],
) -> None:
    url, monitor = server_without_jetstream
    for _try in range(3):
        with pytest.raises(LogError, match=r"JetStream does not .* -js"):
            await EventLog.connect(url, wait_seconds=2)
    deadline = time.monotonic() + 5
    while (left := await asyncio.to_thread(_clients, monitor)) > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert left == 0, f"{left} connections left behind by failed connects"
