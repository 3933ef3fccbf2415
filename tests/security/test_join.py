"""Joining with a token, against a real nats-server configured as `shoal nats` configures it
(README "Adding a machine"): the desk answers as the admin, the server reloads its config.

A fresh node makes its own seeds, joins and publishes on its node's subjects while a client
connected before the join keeps its connection; a used, expired or revoked token, and a join
under an admitted node's id, are refused saying what to do; a revoked node's connection is closed
by the server and the master is told it left; over TLS the server's CA must hash to the token's
pin, and a wrong pin is refused before the token's secret is sent."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.identity import NatsIdentity
from eventlog.log import EventLog, LogError
from eventlog.tls import TlsFiles
from eventlog.wire import Wire, WireError
from events.catalogue import NodeHeartbeat, NodeJoined, NodeLeft, Origin
from events.ids import NodeId
from events.origins import OPERATOR, WORKER
from events.stamp import Stamper
from events.subjects import subject_for
from services.commands.nats_token_cmd import revoke_node_command
from services.credentials import JOIN_IDENTITY, ensure_identities, read_registry, seed_path
from services.join_client import JoinRefused, join
from services.join_desk import JoinDesk, ca_fingerprint, create_token, read_tokens, revoke_node, revoke_token
from services.join_tokens import JoinToken, token_state
from services.nats import NO_TLS, EmbeddedNats
from services.nats_permissions import CONTROL, Identity, node_identities
from tests.pki import Pki

HOUR = 3600.0


class Cluster:
    """A server as `shoal nats` runs it, its desk answering, and where its identities live."""

    def __init__(self, server: EmbeddedNats, directory: Path, tls: TlsFiles) -> None:
        self.server = server
        self.directory = directory
        self.tls = tls  # what this host's own clients connect with

    def endpoint(self, identity: Identity, directory: Path | None = None, tls: TlsFiles | None = None) -> NatsEndpoint:
        where = directory or self.directory
        return NatsEndpoint(
            url=self.server.url,
            tls=self.tls if tls is None else tls,
            identity=NatsIdentity(
                nkey_seed_file=str(seed_path(where, identity)),
                inbox_prefix=identity.inbox_prefix,
                manage_streams=identity.role == "admin",
            ),
        )

    def token(self, *, node: str = "", ttl: float = HOUR, now: float | None = None, pin: bytes = b"") -> JoinToken:
        made, _ = create_token(
            self.directory, node=node, ttl_seconds=ttl, ca_sha256=pin, now=time.time() if now is None else now
        )
        return made


def _start(root: Path, tls: TlsFiles = NO_TLS) -> tuple[EmbeddedNats, Path]:
    directory = root / "nats-credentials"
    identities = [*CONTROL, JOIN_IDENTITY, *node_identities("node-a")]
    server = EmbeddedNats(data_dir=root, port=0, tls=tls, config_file=ensure_identities(directory, identities))
    return server.start(), directory


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    server, directory = _start(tmp_path / "control")
    async with _desk(Cluster(server, directory, TlsFiles()), ca_file="") as running:
        yield running


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"), "join")


@pytest.fixture
async def tls_cluster(tmp_path: Path, pki: Pki) -> AsyncIterator[Cluster]:
    server, directory = _start(tmp_path / "control", pki.server_files(verify_clients=True))  # as embedded with a CA
    async with _desk(Cluster(server, directory, pki.client_files(with_cert=True)), ca_file=str(pki.ca)) as running:
        yield running


class _desk:
    """The desk serving in the background for the test's length; the server stopped after."""

    def __init__(self, cluster: Cluster, ca_file: str) -> None:
        self.cluster = cluster
        self.ca_file = ca_file
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Cluster:
        cluster = self.cluster
        desk = JoinDesk(
            directory=cluster.directory, store_dir=cluster.server.store_dir, ca_file=self.ca_file, clock=time.time
        )
        ready = asyncio.Event()
        self.task = asyncio.create_task(desk.serve(cluster.endpoint(Identity("admin")), ready))
        await asyncio.wait_for(ready.wait(), 30)
        admin = await EventLog.connect(cluster.endpoint(Identity("admin")))  # the streams, as `shoal nats` makes them
        await admin.close()
        return cluster

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await asyncio.to_thread(self.cluster.server.stop)


def _joined(node: str) -> NodeJoined:
    env = Stamper(Origin(service=WORKER, node=node)).stamp()
    return NodeJoined(env=env, node_id=NodeId(node), host="h", cores=1, memory_bytes=1, backend="cpu", version="0")


async def _publish_refusal(endpoint: NatsEndpoint, subject: str) -> str:
    wire = await Wire.open(endpoint.url, tls=endpoint.tls_context(), identity=endpoint.identity)
    try:
        wire.publish(subject.encode(), b"{}")
        await wire.roundtrip()
    except WireError as exc:
        return str(exc)
    finally:
        wire.close()
    return ""


async def test_a_fresh_node_joins_and_publishes_as_itself_while_others_stay_connected(
    cluster: Cluster, tmp_path: Path
) -> None:
    dropped = asyncio.Event()

    async def on_disconnect() -> None:
        dropped.set()

    before = await nats.connect(  # pyright: ignore[reportUnknownMemberType]
        cluster.server.url,
        disconnected_cb=on_disconnect,
        **cluster.endpoint(Identity("worker", "node-a")).identity.nats_py_kwargs(),
    )
    node_dir = tmp_path / "new-machine" / "nats-credentials"
    token = cluster.token()
    joined = await join(cluster.server.url, token, "node-new", node_dir, TlsFiles())
    assert joined.node == "node-new" and joined.ca == ""
    for identity in node_identities("node-new"):
        seed = seed_path(node_dir, identity)
        assert seed.stat().st_mode & 0o777 == 0o600
        assert not seed_path(cluster.directory, identity).exists(), "a seed was made off the node"
    assert not seed_path(node_dir, JOIN_IDENTITY).exists()  # the token's identity is not kept
    assert read_registry(cluster.directory).users.keys() >= {"worker-node-new", "runner-node-new"}

    log = await EventLog.connect(cluster.endpoint(Identity("worker", "node-new"), node_dir))
    try:
        assert await log.append_many([_joined("node-new")]) == [1]
        beat = NodeHeartbeat(env=Stamper(Origin(service=WORKER, node="node-new")).stamp(), node_id=NodeId("node-new"))
        await log.append_many([beat])
    finally:
        await log.close()
    # its identity speaks only for itself, as a bundle's would
    refused = await _publish_refusal(
        cluster.endpoint(Identity("worker", "node-new"), node_dir), subject_for(_joined("node-a"))
    )
    assert "Permissions Violation" in refused
    await before.flush(timeout=5)  # pyright: ignore[reportUnknownMemberType]
    assert not dropped.is_set() and before.is_connected, "the reload dropped a client whose identity stayed"
    await before.close()
    assert token_state(read_tokens(cluster.directory).tokens[token.token_id], time.time()) == "used"


async def test_the_join_identity_may_only_ask_to_join(cluster: Cluster) -> None:
    token = cluster.token()
    directory = cluster.directory.parent / "join-only"
    directory.mkdir()
    (directory / "join.nk").write_bytes(token.join_seed)
    join_endpoint = cluster.endpoint(JOIN_IDENTITY, directory)
    for subject in (subject_for(_joined("node-z")), "$JS.API.STREAM.INFO.SHOAL_EVENTS", "shoal.hb.node.node-z"):
        assert "Permissions Violation" in await _publish_refusal(join_endpoint, subject)


@pytest.mark.parametrize("how", ["used", "expired", "revoked", "taken", "wrong-node"])
async def test_a_token_that_cannot_admit_is_refused_saying_what_to_do(
    cluster: Cluster, tmp_path: Path, how: str
) -> None:
    url = cluster.server.url
    match how:
        case "used":
            token = cluster.token()
            await join(url, token, "node-first", tmp_path / "first", TlsFiles())
            says = "used already.*shoal nats token create"
        case "expired":
            token = cluster.token(now=time.time() - 2 * HOUR, ttl=HOUR)
            says = "expired.*shoal nats token create"
        case "revoked":
            token = cluster.token()
            revoke_token(cluster.directory, token.token_id, time.time())
            says = "revoked.*shoal nats token create"
        case "taken":
            token = cluster.token()
            says = "node 'node-a' is admitted already.*revoke-node node-a"
        case _:
            token = cluster.token(node="node-x")
            says = "is for node 'node-x'"
    node = "node-a" if how == "taken" else "node-second"
    users_before = read_registry(cluster.directory).users
    with pytest.raises(JoinRefused, match=says):
        await join(url, token, node, tmp_path / "second", TlsFiles())
    assert read_registry(cluster.directory).users == users_before  # nothing admitted, the node-a keys untouched
    assert not list((tmp_path / "second").glob("*-node-*.nk")), "a refused join left seeds behind"
    if how in ("taken", "wrong-node"):
        assert token_state(read_tokens(cluster.directory).tokens[token.token_id], time.time()) == "valid"


async def test_a_revoked_node_is_cut_off_and_the_master_is_told_it_left(cluster: Cluster, tmp_path: Path) -> None:
    node_dir = tmp_path / "node-b"
    await join(cluster.server.url, cluster.token(node="node-b"), "node-b", node_dir, TlsFiles())
    log = await EventLog.connect(cluster.endpoint(Identity("worker", "node-b"), node_dir))
    closed = asyncio.Event()

    async def on_disconnect() -> None:
        closed.set()

    connection = await nats.connect(  # pyright: ignore[reportUnknownMemberType]
        cluster.server.url,
        disconnected_cb=on_disconnect,
        allow_reconnect=False,
        **cluster.endpoint(Identity("worker", "node-b"), node_dir).identity.nats_py_kwargs(),
    )
    try:
        assert await log.append_many([_joined("node-b")]) == [1]
        started = time.monotonic()
        args = argparse.Namespace(
            config=None,
            data_dir=str(cluster.directory.parent),
            nats_credentials_dir=None,
            nats_port=str(cluster.server.port),
            node="node-b",
            reason="",
        )
        assert await asyncio.to_thread(revoke_node_command, args) == 0
        await asyncio.wait_for(closed.wait(), 10)  # the server closed its connection
        cut_off = time.monotonic() - started
        assert cut_off < 10
        with pytest.raises(LogError, match="Authorization Violation"):
            await EventLog.connect(cluster.endpoint(Identity("worker", "node-b"), node_dir), wait_seconds=0.5)
    finally:
        await connection.close()
        await log.close()
    admin = await EventLog.connect(cluster.endpoint(Identity("admin")))
    try:
        state = await admin.fold()
    finally:
        await admin.close()
    gone = state.nodes[NodeId("node-b")]
    assert gone.status == "left" and "revoke" in gone.reason
    assert not state.quarantined, "the operator's NodeLeft was refused by the fold"
    # revoking twice: nothing left to revoke, said so
    assert revoke_node(cluster.directory, cluster.server.store_dir, "node-b") == ([], False)


async def test_a_revoked_node_may_join_again_with_new_keys(cluster: Cluster, tmp_path: Path) -> None:
    node_dir = tmp_path / "node-c"
    await join(cluster.server.url, cluster.token(), "node-c", node_dir, TlsFiles())
    old_key = read_registry(cluster.directory).users["worker-node-c"]
    await asyncio.to_thread(revoke_node, cluster.directory, cluster.server.store_dir, "node-c")
    await join(cluster.server.url, cluster.token(), "node-c", node_dir, TlsFiles())
    assert read_registry(cluster.directory).users["worker-node-c"] != old_key
    log = await EventLog.connect(cluster.endpoint(Identity("worker", "node-c"), node_dir))
    try:
        assert await log.append_many([_joined("node-c")]) == [1]
    finally:
        await log.close()


async def test_over_tls_the_node_pins_the_ca_by_the_tokens_fingerprint(
    tls_cluster: Cluster, pki: Pki, tmp_path: Path
) -> None:
    own_cert = TlsFiles(cert=str(pki.client_cert), key=str(pki.client_key))  # the server verifies clients
    node_dir = tmp_path / "tls-node"
    token = tls_cluster.token(pin=ca_fingerprint(str(pki.ca)))
    joined = await join(tls_cluster.server.url, token, "node-t", node_dir, own_cert)
    assert joined.ca and Path(joined.ca).read_bytes().strip() == pki.ca.read_bytes().strip()
    tls = msgspec.structs.replace(own_cert, ca=joined.ca)
    log = await EventLog.connect(tls_cluster.endpoint(Identity("worker", "node-t"), node_dir, tls))
    try:
        assert await log.append_many([_joined("node-t")]) == [1]
    finally:
        await log.close()


async def test_over_tls_a_wrong_fingerprint_is_refused_before_the_secret_is_sent(
    tls_cluster: Cluster, pki: Pki, tmp_path: Path
) -> None:
    own_cert = TlsFiles(cert=str(pki.client_cert), key=str(pki.client_key))
    token = tls_cluster.token(pin=bytes(32))
    with pytest.raises(JoinRefused, match=r"presented a CA whose SHA-256 is .* not the token's"):
        await join(tls_cluster.server.url, token, "node-t", tmp_path / "tls-node", own_cert)
    record = read_tokens(tls_cluster.directory).tokens[token.token_id]
    assert token_state(record, time.time()) == "valid", "the secret reached the desk"
    assert "worker-node-t" not in read_registry(tls_cluster.directory).users


def test_the_operator_may_say_a_node_left() -> None:
    """Pure: the fold takes a NodeLeft from the operator (its worker is cut off), not a forged
    one from another node's worker."""
    from events.origins import origin_refusal
    from events.state import State

    left = NodeLeft(env=Stamper(Origin(service=OPERATOR)).stamp(), node_id=NodeId("node-b"), reason="revoked")
    assert origin_refusal(State(), left) is None
    forged = NodeLeft(env=Stamper(Origin(service=WORKER, node="node-a")).stamp(), node_id=NodeId("node-b"), reason="x")
    assert origin_refusal(State(), forged) is not None
