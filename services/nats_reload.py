"""Reload a running embedded nats-server's configuration: who it admits changes without a restart.

A join admits a node, `shoal nats revoke-node` removes one; each rewrites the server config
(`services/credentials.py`) and then asks the server to read it again. nats-server reloads on
SIGHUP (`nats-server --signal reload` sends the same) without dropping a client whose identity is
still admitted, applies changed permissions to connections already open, and closes the
connections of identities no longer admitted. It says so in its log: `reload_server` waits for
that line, so a caller answers only once the change holds.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from services.nats_errors import BINARY, NatsError
from services.nats_store import LOG_FILE, OWNER_FILE, PID_FILE, store_holder

RELOADED = "Reloaded server configuration"
RELOAD_FAILED = "Failed to reload server configuration"


class NatsReloadFailed(NatsError):
    """The server refused the new configuration (it keeps serving the old one)."""


def reload_server(store_dir: Path, timeout: float = 10.0) -> bool:
    """Ask the server running on the JetStream store `store_dir` to reread its configuration, and
    wait until it has: True. False when no server runs there (the new configuration takes effect
    when one starts). `NatsReloadFailed` with the server's words when it refused it."""
    store_dir = Path(os.path.abspath(store_dir))  # as the server's command line names it
    holder = store_holder(store_dir, BINARY, store_dir / PID_FILE, store_dir / OWNER_FILE)
    if holder is None:
        return False
    log = store_dir / LOG_FILE
    start = log.stat().st_size if log.exists() else 0
    os.kill(holder.pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = _written_since(log, start)
        for line in said.splitlines():
            if RELOADED in line:
                return True
            if RELOAD_FAILED in line:
                raise NatsReloadFailed(f"nats-server (pid {holder.pid}) refused the new configuration: {line.strip()}")
        time.sleep(0.02)  # the server's only answer is its log: nothing to wait on but the file
    raise NatsReloadFailed(
        f"nats-server (pid {holder.pid}) did not say it reloaded its configuration within {timeout:.0f}s; see {log}"
    )


def _written_since(log: Path, offset: int) -> str:
    try:
        with log.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
