"""A live `shoal up`: its NATS admits only the identities it made, the services do their jobs under
them, and no secret reaches a command line, a runner's environment or `/v1/config`."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.endpoint import IDENTITY_ENV
from eventlog.identity import NatsIdentity
from eventlog.tls import TlsFiles
from eventlog.wire import Wire, WireClosed
from services.credentials import DEFAULT_DIRNAME, seed_path
from services.join_client import join
from services.join_tokens import decode_token
from services.nats_permissions import Identity
from tests.e2e.cluster import Cluster, shoal_argv


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("secured-up"), workers=1)
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def seeds(cluster: Cluster) -> dict[str, str]:
    directory = cluster.root / "data" / DEFAULT_DIRNAME
    return {path.name: path.read_text().strip() for path in directory.glob("*.nk")}


def test_its_nats_refuses_a_client_without_an_identity(up: Cluster) -> None:
    with pytest.raises(WireClosed, match="Authorization Violation"):
        asyncio.run(Wire.open(up.nats_url))


def test_an_operator_command_without_an_identity_is_told_so_at_once(up: Cluster, tmp_path: Path) -> None:
    """Not after a timeout that asks whether the server is running: it answered, and refused us."""
    env = {**os.environ, "SHOAL_DATA_DIR": str(tmp_path)}  # no credentials there
    env.pop(IDENTITY_ENV, None)
    started = time.monotonic()
    out = subprocess.run(
        shoal_argv("diagnose", "--nats-url", up.nats_url),
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert "Authorization Violation" in out.stderr and "need an identity (nats_credentials_dir)" in out.stderr, (
        out.stderr
    )
    assert time.monotonic() - started < 4.5  # the command's own connect timeout is 5 s


def test_the_services_serve_a_request_under_their_identities(up: Cluster) -> None:
    reply = up.client().chat.completions.create(
        model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_runner_identity_cannot_cancel_a_task_nor_place_a_model(up: Cluster) -> None:
    directory = up.root / "data" / DEFAULT_DIRNAME
    runner = Identity("runner", "node-0")
    options = NatsIdentity(nkey_seed_file=str(seed_path(directory, runner)), inbox_prefix=runner.inbox_prefix)

    async def attempt(subject: str) -> str:
        wire = await Wire.open(up.nats_url, identity=options)
        try:
            wire.publish(subject.encode(), b"{}")
            await wire.roundtrip()
        except ConnectionError as exc:
            return str(exc)
        finally:
            wire.close()
        return ""

    for subject in ("shoal.ev.task.any.cancelled", "shoal.ev.instance.any.placed"):
        assert "Permissions Violation for Publish" in asyncio.run(attempt(subject))


def test_secrets_stay_in_private_files(up: Cluster) -> None:
    directory = up.root / "data" / DEFAULT_DIRNAME
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert {stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()} == {0o600}
    secrets = seeds(up).values()
    pids = up.runner_pids()
    assert pids, "no runner to inspect"
    for pid in pids.values():
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode()
        assert not any(secret in argv or secret in environ for secret in secrets)
        assert f"{IDENTITY_ENV}=" in environ and "runner-node-0.nk" in environ  # a path, not the seed
    with up.http() as http:
        body = http.get("/v1/config").text
    assert not any(secret in body for secret in secrets)
    assert str(directory) in body
    assert not any(secret in up.up.tail(200_000) for secret in secrets)  # nor in its logs


def test_a_machine_joins_a_running_shoal_up_with_a_token(up: Cluster, tmp_path: Path) -> None:
    """`shoal up` answers join requests: a token made beside it admits a new node's own keys."""
    made = subprocess.run(
        shoal_argv("nats", "token", "create", "--data-dir", str(up.root / "data")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    node_dir = tmp_path / "new-machine"
    asyncio.run(join(up.nats_url, decode_token(made.stdout), "node-new", node_dir, TlsFiles()))
    worker = Identity("worker", "node-new")
    options = NatsIdentity(nkey_seed_file=str(seed_path(node_dir, worker)), inbox_prefix=worker.inbox_prefix)

    async def beat() -> None:
        wire = await Wire.open(up.nats_url, identity=options)
        try:
            wire.publish(b"shoal.hb.node.node-new", b"{}")
            await wire.roundtrip()  # a refusal would come back before the PONG
        finally:
            wire.close()

    asyncio.run(beat())
    assert not seed_path(up.root / "data" / DEFAULT_DIRNAME, worker).exists()  # its seed never left it
