"""Off loopback, TLS or nothing (issue 43): `shoal up` / `shoal nats` listening on another address
without a certificate refuse to start, saying why and how to fix it, unless `--insecure-plaintext`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from eventlog.tls import TlsFiles
from events.synthetic import synthetic_history
from services.nats import EmbeddedNats, PlaintextOffLoopback, free_port, is_loopback, read_info

LOOPBACK = ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"]
NOT_LOOPBACK = ["0.0.0.0", "::", "10.0.0.5", "192.168.1.20", "nats.example"]


@pytest.mark.parametrize(("host", "loopback"), [*((h, True) for h in LOOPBACK), *((h, False) for h in NOT_LOOPBACK)])
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


def test_shoal_nats_certs_makes_a_ca_and_host_certificates_a_tls_server_and_its_clients_use(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    shoal = [sys.executable, "-m", "services.cli", "nats", "certs"]
    made = subprocess.run([*shoal, "--out", str(out), "--hosts", "127.0.0.1,node-a"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert "nats_tls_ca" in made.stdout and "ca-key.pem" in made.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "127.0.0.1-key.pem",
        "127.0.0.1.pem",
        "ca-key.pem",
        "ca.pem",
        "node-a-key.pem",
        "node-a.pem",
    ]
    assert all((out / name).stat().st_mode & 0o077 == 0 for name in ("ca-key.pem", "127.0.0.1-key.pem"))
    again = subprocess.run([*shoal, "--out", str(out), "--hosts", "x"], capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr  # never overwrites a CA

    server_tls = TlsFiles(ca=str(out / "ca.pem"), cert=str(out / "127.0.0.1.pem"), key=str(out / "127.0.0.1-key.pem"))
    client_tls = TlsFiles(ca=str(out / "ca.pem"), cert=str(out / "node-a.pem"), key=str(out / "node-a-key.pem"))

    async def append_over_tls(url: str) -> int:
        log = await EventLog.connect(NatsEndpoint(url=url, tls=client_tls))
        try:
            return await log.append(synthetic_history(1)[0])
        finally:
            await log.close()

    with EmbeddedNats(data_dir=tmp_path / "store", host="0.0.0.0", port=0, tls=server_tls) as server:  # off loopback
        assert server.url.startswith("tls://")
        url = f"tls://127.0.0.1:{server.port}"  # the address its certificate names
        assert asyncio.run(append_over_tls(url)) == 1  # the client verified the server, and it the client
