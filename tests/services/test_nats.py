"""The embedded nats-server: start, readiness, clean stop, clear errors; `shoal nats` + `shoal events tail`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from eventlog.log import EventLog, LogError
from events.synthetic import synthetic_history
from services import nats as embedded
from services.config import resolve_config
from services.credentials import endpoint_for
from services.nats import (
    EmbeddedNats,
    NatsBinaryNotFound,
    NatsStartFailed,
    PortInUse,
    StoreInUse,
    find_nats_server,
    free_port,
)
from services.nats_keeper import keep_running
from services.nats_permissions import Identity
from services.nats_store import command_and_parent


def test_the_binary_of_the_wheel_is_found() -> None:
    path = Path(find_nats_server())
    assert path.name == "nats-server" and os.access(path, os.X_OK)


def test_a_missing_binary_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(embedded.sysconfig, "get_path", lambda _name: str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NatsBinaryNotFound, match=r"uv sync.*--nats-url"):
        find_nats_server()


def test_start_is_ready_for_jetstream_and_stop_is_clean(tmp_path: Path) -> None:
    server = EmbeddedNats(data_dir=tmp_path, port=0)
    with server:
        assert server.running and server.port > 0
        info = embedded.read_info("127.0.0.1", server.port)
        assert info is not None and info["jetstream"] is True
        assert (tmp_path / "nats").is_dir()
    assert not server.running
    assert embedded.port_is_free("127.0.0.1", server.port)


async def test_async_context_manager(tmp_path: Path) -> None:
    async with EmbeddedNats(data_dir=tmp_path, port=0) as server:
        log = await EventLog.connect(server.url)
        assert await log.append(synthetic_history(1)[0]) == 1
        await log.close()


def test_a_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUse, match=rf"port {port} .* already in use.*--nats-port"):
            EmbeddedNats(data_dir=tmp_path, port=port).start()


def test_a_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    server = EmbeddedNats(data_dir=tmp_path, port=0, extra_args=("--no_such_flag",), ready_timeout=5)
    with pytest.raises(NatsStartFailed, match="exited during start"):
        server.start()
    assert not server.running


@pytest.mark.timeout(60)
async def test_keep_running_starts_a_killed_server_again_with_its_log(tmp_path: Path) -> None:
    server = EmbeddedNats(data_dir=tmp_path, port=0).start()
    keeper = asyncio.create_task(keep_running(server, poll_seconds=0.05))
    try:
        log = await EventLog.connect(server.url)
        history = synthetic_history(2)
        assert await log.append(history[0]) == 1
        killed, port = server.pid, server.port
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        async with asyncio.timeout(20):
            while server.pid == killed or not server.running:
                await asyncio.sleep(0.05)
        assert server.port == port  # where every client reconnects
        async with asyncio.timeout(20):  # the client's reconnect finds it; the log goes on from seq 1
            assert await log.append(history[1]) == 2
        await log.close()
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        server.stop()
    assert not server.running


LEFT_BEHIND = """
import os, signal, sys
from services.nats import EmbeddedNats
server = EmbeddedNats(data_dir=sys.argv[1], port=0).start()
print(server.port, server.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # its owner dies without stopping it
"""


@pytest.mark.timeout(60)
def test_a_server_whose_owner_was_killed_is_stopped_by_the_next_start_on_its_store(tmp_path: Path) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", LEFT_BEHIND, str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    port, left_pid = (int(word) for word in killed.stdout.split())
    try:
        assert embedded.read_info("127.0.0.1", port) is not None  # still serving, orphaned
        with EmbeddedNats(data_dir=tmp_path, port=port) as server:  # before: PortInUse
            assert server.running and server.pid != left_pid
        assert command_and_parent(left_pid) is None  # gone (or a zombie)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(left_pid, signal.SIGKILL)  # never leave the orphan behind, whatever failed


@pytest.mark.parametrize("same_port", [True, False])
def test_a_store_whose_server_runs_is_refused_not_shared(tmp_path: Path, same_port: bool) -> None:
    """Two servers on one JetStream store would each write it as theirs (before: a second
    `shoal up` on the data dir with another --nats-port started one, and both said ready)."""
    with EmbeddedNats(data_dir=tmp_path, port=0) as first:
        second = EmbeddedNats(data_dir=tmp_path, port=first.port if same_port else 0)
        with pytest.raises(StoreInUse, match=rf"in use by nats-server pid {first.pid} \(port {first.port}.*--data-dir"):
            second.start()
        assert first.running and not second.running


def _read_until(stream: object, marker: str, lines: list[str]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        lines.append(line)
        if marker in line:
            return
    raise AssertionError(f"{marker!r} never printed; got {lines}")


def test_shoal_nats_serves_and_shoal_events_tail_follows(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "SHOAL_DATA_DIR": str(tmp_path), "SHOAL_NATS_PORT": str(port), "SHOAL_LOG_LEVEL": "WARNING"}
    shoal = [sys.executable, "-m", "services.cli"]
    server = subprocess.Popen([*shoal, "nats"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: subprocess.Popen[str] | None = None
    try:
        _read_until(server.stdout, "Ctrl-C to stop", [])
        tail = subprocess.Popen(
            [*shoal, "events", "tail"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        _read_until(tail.stdout, "# tailing", [])

        async def publish() -> None:
            with pytest.raises(LogError, match="cannot connect"):  # the server admits only its identities
                await EventLog.connect(f"nats://127.0.0.1:{port}", wait_seconds=0.3)
            admin = endpoint_for(resolve_config(env=env).config, Identity("admin"))
            log = await EventLog.connect(msgspec.structs.replace(admin, url=f"nats://127.0.0.1:{port}"))
            await log.append_many(synthetic_history(3))
            await log.close()

        asyncio.run(publish())
        lines: list[str] = []
        _read_until(tail.stdout, "instance_placed", lines)
        assert "node_joined" in lines[0] and lines[0].split()[0] == "1"
    finally:
        for process in (tail, server):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in (tail, server):
            if process is not None:
                process.communicate(timeout=15)
    assert server.returncode == 0
    assert embedded.port_is_free("127.0.0.1", port)
