"""The API's listening socket: a port another process holds is a ConfigError naming the setting
and what to do, raised before uvicorn (whose own bind failure calls sys.exit inside the loop)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.api.app import listen_socket
from services.api.auth import ApiAccess
from services.config import ConfigError, resolve_config
from services.roles import run_api
from tests.e2e.cluster import free_port


def test_a_port_in_use_names_the_setting_and_the_fix() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(ConfigError) as raised:
            listen_socket(resolve_config({"api_port": port}, env={}))
    finally:
        holder.close()
    message = str(raised.value)
    assert f"api_port={port}" in message and "already in use" in message and "--port" in message


def test_a_free_port_is_bound_for_uvicorn() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    listener = listen_socket(resolve_config({"api_port": port}, env={}))
    try:
        assert listener.getsockname() == ("127.0.0.1", port)
    finally:
        listener.close()


@pytest.mark.timeout(60)
def test_shoal_api_on_a_port_in_use_says_so_in_one_line_and_exits_1() -> None:
    """The command's own outcome: the message and exit 1, never a traceback (an exception group
    around the ConfigError would slip past the command's handler)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        argv = [sys.executable, "-m", "services.cli", "api", "--port", str(port), "--nats-url", "nats://127.0.0.1:1"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=50)
    finally:
        holder.close()
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"api_port={port}" in done.stderr and "already in use" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


def _unwatched_keys(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Descriptors the loop's selector lists that the kernel's epoll no longer watches: closed
    behind the loop's back. A socket that later gets one of their numbers is never read (asyncio
    only updates the stale key, and skips `epoll_ctl` when the events are the same)."""
    selector: Any = getattr(loop, "_selector", None)
    epoll = getattr(selector, "_selector", None)
    if epoll is None or not Path(f"/proc/self/fdinfo/{epoll.fileno()}").exists():
        pytest.skip("needs Linux's epoll selector and /proc")
    info = Path(f"/proc/self/fdinfo/{epoll.fileno()}").read_text()
    watched = {int(line.split()[1]) for line in info.splitlines() if line.startswith("tfd:")}
    return sorted(key.fd for key in selector.get_map().values() if key.fd not in watched)


@pytest.mark.timeout(60)
async def test_an_api_stopped_and_started_again_in_one_loop_answers(nats_url: str, tmp_path: Path) -> None:
    """As under `supervise` after a crash: the stopped API leaves nothing in the loop watching its
    closed listening socket, so the next one (whose socket takes the same number) accepts."""
    port = free_port()
    env = {
        "SHOAL_NATS_URL": nats_url,
        "SHOAL_API_PORT": str(port),
        "SHOAL_MODELS": "tiny",
        "SHOAL_DATA_DIR": str(tmp_path),
    }
    resolved = resolve_config(env=env)
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        for _start in range(2):
            ready = asyncio.Event()
            api = asyncio.create_task(run_api(resolved, ApiAccess(), ready))
            try:
                await asyncio.wait_for(ready.wait(), 30)
                health = (await http.get("/healthz")).json()
                assert health["degraded"] == "" and health["log_caught_up"], health  # its NATS connection is read
            finally:
                api.cancel()
                await asyncio.gather(api, return_exceptions=True)
            assert _unwatched_keys(loop) == []
