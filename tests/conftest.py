"""Shared fixtures: a real nats-server for the whole session (never a mock), and a clean log per test.

- `nats_server`: the session's `EmbeddedNats` (JetStream, data dir under pytest's tmp dir, free port).
- `nats_url`: its URL.
- `event_log`: an `EventLog` on that server with both streams deleted and recreated, closed after.
- `make_nats`: a factory for extra servers a test owns (stopped at the end), e.g. to restart one.
- `compiled_bytecode` (autouse): every module's bytecode written once, where Python writes none
  (one worker at a time: the suite runs on two, pyproject's `-n 2`).
- `pytest_configure`: Ctrl-C (SIGINT) reaches the suite's processes even when it was started where
  SIGINT is ignored.
- Hypothesis runs without its per-example deadline and too-slow health check: the suite must pass
  on a loaded machine, and a property's examples are judged by what they return, never by time.

Every test has a timeout (pyproject: pytest-timeout, 120 s by default).
"""

from __future__ import annotations

import compileall
import fcntl
import hashlib
import signal
import site
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


@pytest.fixture(scope="session", autouse=True)
def compiled_bytecode() -> None:
    """Where PYTHONDONTWRITEBYTECODE is set (this machine, CI) Python writes no bytecode, so each of
    the suite's hundreds of processes (`shoal up`, every runner and service, CLI calls) compiled
    mlx-lm, transformers and shoal from source at its start: 1-2 s of CPU each. `compileall` writes
    it regardless, once (a later session skips what is up to date); Python checks every .pyc
    against its source, so an edited module never runs stale. The suite's workers (pytest-xdist)
    take turns: the first compiles, the other then finds it all up to date, instead of both
    compiling the same files at once (51 s each on two cores, against 18 s for one)."""
    if not sys.flags.dont_write_bytecode:
        return  # Python writes it as it imports
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"shoal-compileall-{checkout}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        for root in [*(ROOT / package for package in PACKAGES), *map(Path, site.getsitepackages())]:
            compileall.compile_dir(root, quiet=2, workers=0)


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
