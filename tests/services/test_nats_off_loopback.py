"""Off loopback, TLS or nothing (issue 43): `shoal up` / `shoal nats` listening on another address
without a certificate refuse to start, saying why and how to fix it, unless `--insecure-plaintext`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.nats import EmbeddedNats, PlaintextOffLoopback, free_port, is_loopback, read_info


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("192.168.1.20", False), ("nats.example", False)],
)  # fmt: skip
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_plaintext_server_off_loopback_is_refused_saying_why_and_what_to_do(tmp_path: Path) -> None:
    server = EmbeddedNats(data_dir=tmp_path, host="0.0.0.0", port=0)
    with pytest.raises(PlaintextOffLoopback) as refused:
        server.start()
    message = str(refused.value)
    assert all(word in message for word in ("0.0.0.0", "without TLS", "nats_tls_cert", "--insecure-plaintext"))
    assert not server.running and not (tmp_path / "nats").exists()  # nothing started, nothing written


def test_told_insecure_plaintext_it_serves_off_loopback(tmp_path: Path) -> None:
    with EmbeddedNats(data_dir=tmp_path, host="0.0.0.0", port=0, insecure_plaintext=True) as server:
        assert read_info("127.0.0.1", server.port) is not None


@pytest.mark.parametrize("command", [["nats"], ["up", "--workers", "1"]])
def test_shoal_refuses_plaintext_off_loopback_on_its_command_line(tmp_path: Path, command: list[str]) -> None:
    env = {
        **os.environ,
        "SHOAL_DATA_DIR": str(tmp_path),
        "SHOAL_NATS_HOST": "0.0.0.0",
        "SHOAL_NATS_PORT": str(free_port()),
        "SHOAL_LOG_LEVEL": "WARNING",
    }
    env.pop("SHOAL_NATS_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *command], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert "refusing to serve NATS on 0.0.0.0 without TLS" in done.stderr and "--insecure-plaintext" in done.stderr
