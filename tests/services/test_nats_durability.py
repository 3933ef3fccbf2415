"""What an acknowledged event survives (README "Durability"): the embedded server runs the fsync
policy it is given (`nats_sync_interval`, 1 s by default), and a server killed outright (SIGKILL,
nothing flushed on the way out) restarts from its store with every event it acknowledged."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest

from eventlog.log import EventLog
from events.synthetic import synthetic_history
from services.credentials import ensure_identities
from services.nats import EmbeddedNats, free_port
from services.nats_durability import JETSTREAM_SYNC_INTERVAL, NATS_DEFAULT_SYNC_INTERVAL, SYNC_ALWAYS
from services.nats_permissions import CONTROL


def jetstream_config(monitor_port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/varz", timeout=5) as response:
        return json.load(response)["jetstream"]["config"]


S = 1_000_000_000


@pytest.mark.parametrize(
    ("sync_interval", "always", "interval_ns"),
    [(JETSTREAM_SYNC_INTERVAL, False, S), (SYNC_ALWAYS, True, None), (NATS_DEFAULT_SYNC_INTERVAL, False, 120 * S)],
)
def test_the_server_runs_the_fsync_policy_it_was_given(
    tmp_path: Path, sync_interval: str, always: bool, interval_ns: int | None
) -> None:
    monitor = free_port()
    with EmbeddedNats(data_dir=tmp_path, port=0, sync_interval=sync_interval, extra_args=("-m", str(monitor))):
        config = jetstream_config(monitor)
        assert config.get("sync_always", False) is always
        if interval_ns is not None:
            assert config["sync_interval"] == interval_ns


def test_the_default_policy_holds_with_a_config_of_identities_too(tmp_path: Path) -> None:
    """The identities' config is included by the server's own, which sets the policy after it."""
    monitor = free_port()
    config = ensure_identities(tmp_path / "credentials", CONTROL)
    args = ("-m", str(monitor))
    with EmbeddedNats(data_dir=tmp_path, port=0, config_file=config, sync_interval=SYNC_ALWAYS, extra_args=args):
        assert jetstream_config(monitor)["sync_always"] is True


def test_an_fsync_policy_the_server_cannot_read_is_refused_saying_what_it_takes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"always.*duration"):
        EmbeddedNats(data_dir=tmp_path, port=0, sync_interval="sometimes")


@pytest.mark.timeout(60)
async def test_a_server_killed_outright_restarts_with_every_event_it_acknowledged(tmp_path: Path) -> None:
    server = EmbeddedNats(data_dir=tmp_path, port=0).start()
    port = server.port
    events = synthetic_history(3000)
    try:
        log = await EventLog.connect(server.url)
        try:
            seqs = await log.append_many(events)  # every one acknowledged
        finally:
            await log.close()
        assert seqs[-1] == len(events)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)  # at once after the last acknowledgement: nothing flushed on exit
        server.wait()
        server.stop()
        server = EmbeddedNats(data_dir=tmp_path, port=port).start()  # the same store, from disk
        log = await EventLog.connect(server.url)
        try:
            assert [event async for _, event in log.replay()] == events
        finally:
            await log.close()
    finally:
        server.stop()
