"""TLS and nkey identities together, as a deployment across hosts runs them: the server serves
mutual TLS AND admits only its identities, and both of shoal's clients — the wire (TLS upgrade,
then the server's nonce signed) and nats-py — connect through one `NatsEndpoint`."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog, LogError
from events.catalogue import InstancePlaced, NodeJoined
from services.credentials import ensure_identities
from services.nats import EmbeddedNats
from services.nats_permissions import CONTROL, Identity, node_identities
from tests.pki import Pki
from tests.security.conftest import NODES, SecuredBus
from tests.security.test_bus_permissions import one_of_each_kind


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"), "shoal")


@pytest.fixture(scope="module")
def tls_bus(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBus]:
    root = tmp_path_factory.mktemp("tls-secured")
    identities = [*CONTROL, *(identity for node in NODES for identity in node_identities(node))]
    server_config = ensure_identities(root / "nats-credentials", identities)
    tls = pki.server_files(verify_clients=True)
    with EmbeddedNats(data_dir=root, port=0, tls=tls, config_file=server_config) as server:
        yield SecuredBus(server, root / "nats-credentials")


def endpoint(bus: SecuredBus, pki: Pki, identity: Identity) -> NatsEndpoint:
    """`identity`, presenting this host's client certificate."""
    return msgspec.structs.replace(bus.endpoint(identity), tls=pki.client_files(with_cert=True))


async def test_each_client_connects_over_mutual_tls_as_its_identity(tls_bus: SecuredBus, pki: Pki) -> None:
    assert tls_bus.url.startswith("tls://")
    joined = next(e for e in one_of_each_kind() if isinstance(e, NodeJoined))  # node-a's worker may
    placed = next(e for e in one_of_each_kind() if isinstance(e, InstancePlaced))  # the master may
    admin = await EventLog.connect(endpoint(tls_bus, pki, Identity("admin")))
    worker = await EventLog.connect(endpoint(tls_bus, pki, Identity("worker", "node-a")))
    master = await EventLog.connect(endpoint(tls_bus, pki, Identity("master")))
    try:
        await admin.delete_streams()
        await admin.ensure_streams()
        assert await worker.append_many([joined]) == [1]  # the wire: TLS upgrade, then the nonce signed
        assert await master.append(placed) == 2  # nats-py: the same TLS context and nkey
        assert [event async for _, event in master.replay()] == [joined, placed]  # the wire, reading
    finally:
        for log in (admin, worker, master):
            await log.close()


async def test_over_tls_the_server_still_wants_an_identity(tls_bus: SecuredBus, pki: Pki) -> None:
    anonymous = NatsEndpoint(url=tls_bus.url, tls=pki.client_files(with_cert=True))
    with pytest.raises(LogError, match="need an identity"):
        await EventLog.connect(anonymous, wait_seconds=0.3)


async def test_an_identity_without_a_client_certificate_is_refused(tls_bus: SecuredBus, pki: Pki) -> None:
    no_certificate = msgspec.structs.replace(endpoint(tls_bus, pki, Identity("master")), tls=pki.client_files())
    with pytest.raises(LogError, match="nats_tls_cert"):
        await EventLog.connect(no_certificate, wait_seconds=0.5)
