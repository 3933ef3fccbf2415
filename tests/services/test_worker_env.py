"""A runner's environment: what it needs (TLS files, its identity's paths) and no secret setting."""

from __future__ import annotations

from eventlog.endpoint import NatsEndpoint
from eventlog.identity import NatsIdentity
from eventlog.tls import TlsFiles
from services.worker.procs import child_env


def test_a_runner_inherits_no_secret_setting() -> None:
    inherited = {
        "SHOAL_API_KEYS": "a-key-of-sixteen-chars:admin",
        "SHOAL_API_KEYS_FILE": "/etc/shoal/keys",
        "SHOAL_DATA_DIR": "/data",
        "PATH": "/usr/bin",
    }
    endpoint = NatsEndpoint(
        url="tls://h:4222", tls=TlsFiles(ca="/ca.pem"), identity=NatsIdentity(nkey_seed_file="/runner.nk")
    )
    env = child_env(endpoint.child_env(), inherited)
    assert "SHOAL_API_KEYS" not in env
    assert not any("a-key-of-sixteen-chars" in value for value in env.values())
    assert env["SHOAL_DATA_DIR"] == "/data" and env["PATH"] == "/usr/bin"  # the rest passes through
    assert NatsEndpoint.from_env(endpoint.url, env) == endpoint
