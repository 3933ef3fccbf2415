"""Shared fixtures: a real nats-server for the whole session (never a mock), and a clean log per test.

- `nats_server`: the session's `EmbeddedNats` (JetStream, data dir under pytest's tmp dir, free port).
- `nats_url`: its URL.
- `event_log`: an `EventLog` on that server with both streams deleted and recreated, closed after.
- `make_nats`: a factory for extra servers a test owns (stopped at the end), e.g. to restart one.
- `compiled_bytecode` (autouse): every module's bytecode written once, where Python writes none,
  by one process in the background (the suite runs on two workers, pyproject's `-n 2`).
- `pytest_configure`: Ctrl-C (SIGINT) reaches the suite's processes even when it was started where
  SIGINT is ignored.
- Hypothesis runs without its per-example deadline and too-slow health check: the suite must pass
  on a loaded machine, and a property's examples are judged by what they return, never by time.

Every test has a timeout (pyproject: pytest-timeout, 120 s by default).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import site
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from eventlog.log import EventLog
from services.nats import EmbeddedNats

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("events", "eventlog", "services", "runner", "bench", "tests")

settings.register_profile("loaded-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("loaded-machine")


def pytest_configure(config: pytest.Config) -> None:
    """A suite started as a background job of a non-interactive shell (`pytest &` in a script, CI
    wrappers, nohup) inherits SIGINT ignored, and every process it starts would too: `shoal up`,
    `shoal nats` and `shoal events tail` then shrug off the Ctrl-C that the tests stop them with,
    each teardown waits for its timeout, and the nats-servers outlive the suite. The handler Python
    installs by default makes the children's SIGINT default again (an exec keeps only "ignored")."""
    del config
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Compiles the directories it is given, unless another process holds the lock and does it already.
COMPILE_ALL = """
import compileall, fcntl, sys
with open(sys.argv[1], "w") as lock:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes
    except BlockingIOError:
        sys.exit(0)  # the other worker's compiler has it in hand
    for root in sys.argv[2:]:
        compileall.compile_dir(root, quiet=2, workers=0)
"""


@pytest.fixture(scope="session", autouse=True)
def compiled_bytecode() -> Iterator[None]:
    """Where PYTHONDONTWRITEBYTECODE is set (this machine, CI) Python writes no bytecode, so each of
    the suite's hundreds of processes (`shoal up`, every runner and service, CLI calls) compiled
    mlx-lm, transformers and shoal from source at its start: 1-2 s of CPU each. `compileall` writes
    it regardless, once (a later session skips what is up to date); Python checks every .pyc
    against its source, so an edited module never runs stale, and writes each one atomically.

    One process compiles, in the background: the suite's workers (pytest-xdist) would otherwise
    compile the same files at once, and no test waits for it. A process started meanwhile compiles
    what it imports for itself, as before. Waited for inside the first test, on a fresh clone of a
    loaded machine the compile ran past the per-test timeout, and a session fixture that fails
    fails every test of its worker: all 2,512 of them errored."""
    if not sys.flags.dont_write_bytecode:
        yield  # Python writes it as it imports
        return
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    lock = Path(tempfile.gettempdir()) / f"shoal-compileall-{checkout}.lock"
    roots = [*(ROOT / package for package in PACKAGES), *map(Path, site.getsitepackages())]
    compiler = subprocess.Popen(
        [sys.executable, "-c", COMPILE_ALL, str(lock), *map(str, roots)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the suite is the suite's to handle; the kill below stops it
    )
    try:
        yield
    finally:
        # a session that ends first leaves the rest to the next one; the whole group, since
        # compileall's worker processes would otherwise wait on their pipe forever, orphaned
        with contextlib.suppress(ProcessLookupError):
            os.killpg(compiler.pid, signal.SIGKILL)
        compiler.wait()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats-session"), port=0) as server:
        yield server


@pytest.fixture(scope="session")
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture
async def event_log(nats_url: str) -> AsyncIterator[EventLog]:
    log = await EventLog.connect(nats_url, ensure=False)
    await log.delete_streams()
    await log.ensure_streams()
    try:
        yield log
    finally:
        await log.close()


@pytest.fixture
def make_nats(tmp_path: Path) -> Iterator[Callable[..., EmbeddedNats]]:
    servers: list[EmbeddedNats] = []

    def make(name: str = "extra", port: int = 0) -> EmbeddedNats:
        server = EmbeddedNats(data_dir=tmp_path / name, port=port)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
