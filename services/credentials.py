"""The bus's identities on disk: nkey seed files and the nats-server config that admits them
(README "Security"; who may do what is `services/nats_permissions.py`).

    server_conf = ensure_identities(directory, [*CONTROL, *node_identities("node-0")])
    EmbeddedNats(..., config_file=server_conf)               # refuses every other client
    endpoint = endpoint_for(config, Identity("master"))      # what the master connects with

A directory of identities holds `<identity>.nk` (a seed: that identity's only secret),
`identities.json` (every identity the server admits, by public key, and the cluster route
password) and `nats-server.conf` rendered from it; all 0600, in a 0700 directory. `shoal up`
keeps one under `<data_dir>/nats-credentials`; `write_bundle` lays out one directory per host
for a deployment on several machines. Why nkeys rather than JWTs: the server config is one file
of public keys with their permissions, nothing to run beside the server (no operator, account
or resolver), and a seed never leaves the host that uses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Generator, Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from eventlog.endpoint import NatsEndpoint
from eventlog.identity import ANONYMOUS, NatsIdentity
from services.config import ShoalConfig
from services.nats import EmbeddedNats
from services.nats_permissions import CONTROL, ClusterRoutes, Identity, node_identities, server_config

SEED_SUFFIX = ".nk"
REGISTRY = "identities.json"
SERVER_CONFIG = "nats-server.conf"
DEFAULT_DIRNAME = "nats-credentials"
SERVER_HOST_DIR = "nats-server"
CONTROL_HOST_DIR = "control"
LOCK_FILE = ".lock"
# What a new machine reaches the bus as until it is admitted: it may only ask to join
# (`services/join_desk.py`); its seed is in every join token.
JOIN_IDENTITY = Identity("join")


class CredentialsError(RuntimeError):
    """An identity is missing or its files do not agree; the message says what to do."""


class Registry(msgspec.Struct, kw_only=True):
    """Who the server admits: identity name -> public nkey; the routes of a cluster, if any."""

    users: dict[str, str] = msgspec.field(default_factory=dict[str, str])
    routes: ClusterRoutes | None = None

    def admitted(self) -> dict[Identity, str]:
        return {Identity.parse(name): key for name, key in self.users.items()}


def cluster_config_name(index: int) -> str:
    """The config file of the cluster's server `index` (0-based): cluster-1.conf, cluster-2.conf..."""
    return f"cluster-{index + 1}.conf"


def new_seed() -> bytes:
    """A fresh user nkey seed (`SU...`), from the OS's randomness."""
    import nkeys  # pyright: ignore[reportMissingTypeStubs]

    module: Any = nkeys
    return bytes(module.encode_seed(secrets.token_bytes(32), module.PREFIX_BYTE_USER))


def public_key(seed: bytes) -> str:
    import nkeys  # pyright: ignore[reportMissingTypeStubs]

    module: Any = nkeys
    key: Any = module.from_seed(bytearray(seed))
    try:
        return bytes(key.public_key).decode()
    finally:
        key.wipe()


def write_secret(path: Path, data: bytes) -> None:
    """Write `data` to `path`, readable by its owner only (0600) from the first byte on."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
        handle.write(data)


def private_dir(directory: Path) -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def seed_path(directory: Path, identity: Identity) -> Path:
    return directory / f"{identity.name}{SEED_SUFFIX}"


def _write_registry(directory: Path, registry: Registry) -> Path:
    """The registry, the config of a lone server and, for a cluster, one config per member."""
    write_secret(directory / REGISTRY, msgspec.json.format(msgspec.json.encode(registry)) + b"\n")
    users = registry.admitted()
    write_secret(directory / SERVER_CONFIG, server_config(users).encode())
    routes = registry.routes
    for index in range(len(routes.servers) if routes is not None else 0):
        write_secret(directory / cluster_config_name(index), server_config(users, routes, index).encode())
    return directory / SERVER_CONFIG


@contextlib.contextmanager
def directory_lock(directory: Path) -> Generator[None]:
    """One writer at a time of a directory's registry and join tokens: the server's process
    admits a joining node while `shoal nats revoke-node` or `token create` may run beside it."""
    descriptor = os.open(private_dir(directory) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def read_registry(directory: Path) -> Registry:
    registry_file = directory / REGISTRY
    return msgspec.json.decode(registry_file.read_bytes(), type=Registry) if registry_file.exists() else Registry()


def ensure_identities(directory: Path, wanted: Iterable[Identity]) -> Path:
    """Make those of the `wanted` identities that the server does not admit yet; the path of the
    server config admitting them all.

    Identities already admitted are kept: a restarted `shoal up` keeps its keys, and a bundle's
    server keeps the identities whose seeds live on other hosts (or that joined with a token)."""
    with directory_lock(directory):
        registry = read_registry(directory)
        for identity in wanted:
            path = seed_path(directory, identity)
            if path.exists():
                registry.users[identity.name] = public_key(path.read_bytes().strip())
            elif identity.name not in registry.users:
                seed = new_seed()
                write_secret(path, seed + b"\n")
                registry.users[identity.name] = public_key(seed)
        return _write_registry(directory, registry)


def admitted_nodes(registry: Registry) -> frozenset[str]:
    """The nodes some identity of which the server admits."""
    return frozenset(identity.node for identity in registry.admitted() if identity.node)


def admit_node(directory: Path, node: str, worker_key: str, runner_key: str) -> Registry:
    """Admit `node`'s worker and runner by their public keys (a machine that joined with a token:
    its seeds stay on it); the registry before, to put back if the server refuses the new config.
    The caller holds `directory_lock`."""
    before = read_registry(directory)
    worker, runner = node_identities(node)
    users = {**before.users, worker.name: worker_key, runner.name: runner_key}
    _write_registry(directory, msgspec.structs.replace(before, users=users))
    return before


def remove_node(directory: Path, node: str) -> list[str]:
    """Stop admitting `node`'s identities and delete any of their seeds kept here; the names of
    the identities it admitted. The caller holds `directory_lock`."""
    registry = read_registry(directory)
    names = [identity.name for identity in node_identities(node)]
    for identity in node_identities(node):
        seed_path(directory, identity).unlink(missing_ok=True)
    removed = [name for name in names if name in registry.users]
    users = {name: key for name, key in registry.users.items() if name not in names}
    _write_registry(directory, msgspec.structs.replace(registry, users=users))
    return removed


def restore_registry(directory: Path, registry: Registry) -> None:
    """Write `registry` (and its server configs) back, as `admit_node` found it."""
    _write_registry(directory, registry)


def write_bundle(out: Path, nodes: Sequence[str], routes: Sequence[str] = ()) -> dict[str, Path]:
    """Every identity of a cluster with `nodes`, one directory per kind of host (name -> path):

    - `nats-server/`: the server config and the admin, for `shoal nats`; with `routes` (each NATS
      server's `host:cluster-port`), `cluster-<i>.conf` for the i-th of them, routes authenticated;
    - `control/`: admin, master and api, for the host of `shoal master` / `shoal api`;
    - `<node>/`: that node's worker and runner identities, for `shoal worker --node-id <node>`.
    """
    seeds = {identity: new_seed() for identity in (*CONTROL, *(i for n in nodes for i in node_identities(n)))}
    registry = Registry(
        users={identity.name: public_key(seed) for identity, seed in seeds.items()},
        routes=ClusterRoutes(servers=tuple(routes), password=secrets.token_urlsafe(24)) if routes else None,
    )
    admin = Identity("admin")
    hosts: dict[str, list[Identity]] = {SERVER_HOST_DIR: [admin], CONTROL_HOST_DIR: list(CONTROL)}
    hosts |= {node: list(node_identities(node)) for node in nodes}
    written: dict[str, Path] = {}
    for host, identities in hosts.items():
        directory = private_dir(out / host)
        for identity in identities:
            write_secret(seed_path(directory, identity), seeds[identity] + b"\n")
        written[host] = directory
    _write_registry(written[SERVER_HOST_DIR], registry)
    return written


def embedded_server(
    config: ShoalConfig, nodes: Iterable[str], *, insecure_plaintext: bool = False
) -> tuple[EmbeddedNats, Path]:
    """The server `shoal up` and `shoal nats` run (not started yet): this host's `nats_host`,
    `nats_port` and TLS files, admitting the control identities and those of `nodes` (made if
    missing, in the directory returned). Off loopback without TLS it refuses to start unless
    `insecure_plaintext` (`services.nats.PlaintextOffLoopback`)."""
    directory = embedded_credentials_dir(config)
    identities = [*CONTROL, JOIN_IDENTITY, *(identity for node in nodes for identity in node_identities(node))]
    server = EmbeddedNats(
        data_dir=config.data_path,
        host=config.nats_host,
        port=config.nats_port,
        tls=config.nats_tls,
        config_file=ensure_identities(directory, identities),
        sync_interval=config.nats_sync_interval,
        insecure_plaintext=insecure_plaintext,
    )
    return server, directory


def embedded_credentials_dir(config: ShoalConfig) -> Path:
    """Where the embedded server's identities live: `nats_credentials_dir`, else under `data_dir`."""
    if config.nats_credentials_dir:
        return Path(config.nats_credentials_dir).expanduser()
    return config.data_path / DEFAULT_DIRNAME


def credentials_dir(config: ShoalConfig) -> Path | None:
    """This host's identities: `nats_credentials_dir`, else those a server embedded with this
    `data_dir` made (`shoal up`, `shoal nats`), else none (an open server)."""
    directory = embedded_credentials_dir(config)
    if config.nats_credentials_dir or (directory / REGISTRY).is_file():
        return directory
    return None


def endpoint_for(config: ShoalConfig, identity: Identity) -> NatsEndpoint:
    """How `identity` reaches the bus: this host's URL and TLS files (`ShoalConfig.nats_endpoint`)
    and the identity's seed and inbox."""
    return msgspec.structs.replace(config.nats_endpoint, identity=nats_identity(config, identity))


def nats_identity(config: ShoalConfig, identity: Identity) -> NatsIdentity:
    """How `identity` connects to the bus: its seed and inbox, or anonymously without identities."""
    directory = credentials_dir(config)
    if directory is None:
        return ANONYMOUS
    path = seed_path(directory, identity)
    if not path.is_file():
        raise CredentialsError(
            f"no NATS identity {identity.name!r} in {directory} (nats_credentials_dir): the server admits "
            "only the identities made for it: on its host, `shoal nats --nodes NODE,...`; for several hosts, "
            "`shoal nats credentials --out DIR --nodes ...`, then copy each host its directory"
        )
    return NatsIdentity(
        nkey_seed_file=str(path), inbox_prefix=identity.inbox_prefix, manage_streams=identity.role == "admin"
    )
