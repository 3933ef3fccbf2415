"""A nats-server configured exactly as `shoal up` configures its embedded one: every identity of
a two-node cluster (node-a, node-b) admitted with its permissions, nobody else."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.identity import NatsIdentity
from eventlog.log import EventLog
from services.credentials import ensure_identities, seed_path
from services.nats import EmbeddedNats
from services.nats_permissions import CONTROL, Identity, node_identities

NODES = ("node-a", "node-b")


class SecuredBus:
    def __init__(self, server: EmbeddedNats, directory: Path) -> None:
        self.server = server
        self.url = server.url
        self.directory = directory

    def identity(self, identity: Identity) -> NatsIdentity:
        """Who `identity` is on this bus: what `services.credentials.nats_identity` gives it."""
        return NatsIdentity(
            nkey_seed_file=str(seed_path(self.directory, identity)),
            inbox_prefix=identity.inbox_prefix,
            manage_streams=identity.role == "admin",
        )

    def endpoint(self, identity: Identity) -> NatsEndpoint:
        return NatsEndpoint(url=self.url, identity=self.identity(identity))


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBus]:
    root = tmp_path_factory.mktemp("secured")
    directory = root / "nats-credentials"
    identities = [*CONTROL, *(identity for node in NODES for identity in node_identities(node))]
    with EmbeddedNats(data_dir=root, port=0, config_file=ensure_identities(directory, identities)) as server:
        yield SecuredBus(server, directory)


@pytest.fixture
async def admin_log(bus: SecuredBus) -> AsyncIterator[EventLog]:
    """The admin's log, with both streams made fresh for the test."""
    log = await EventLog.connect(bus.endpoint(Identity("admin")), ensure=False)
    await log.delete_streams()
    await log.ensure_streams()
    try:
        yield log
    finally:
        await log.close()
