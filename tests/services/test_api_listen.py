"""The API's listening socket: a port another process holds is a ConfigError naming the setting
and what to do, raised before uvicorn (whose own bind failure calls sys.exit inside the loop)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from services.api.app import listen_socket
from services.config import ConfigError, resolve_config


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
