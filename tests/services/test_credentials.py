"""The bus's identities on disk: private files, stable keys, one directory per host, clear errors."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

import msgspec
import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.identity import ANONYMOUS, NatsIdentity
from eventlog.tls import TlsFiles
from services.commands.nats_cmd import credentials_command
from services.config import DEFAULTS
from services.credentials import (
    REGISTRY,
    SERVER_CONFIG,
    CredentialsError,
    endpoint_for,
    ensure_identities,
    nats_identity,
    seed_path,
    write_bundle,
)
from services.nats_permissions import CONTROL, Identity, node_identities


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_identities_are_private_and_survive_a_restart(tmp_path: Path) -> None:
    directory = tmp_path / "creds"
    conf = ensure_identities(directory, [*CONTROL, *node_identities("node-0")])
    seeds = {path.name: path.read_bytes() for path in directory.glob("*.nk")}
    assert sorted(seeds) == ["admin.nk", "api.nk", "master.nk", "runner-node-0.nk", "worker-node-0.nk"]
    assert mode(directory) == 0o700
    assert {mode(path) for path in directory.iterdir()} == {0o600}
    ensure_identities(directory, [*CONTROL, *node_identities("node-1")])
    assert {path.name: path.read_bytes() for path in directory.glob("*.nk") if path.name in seeds} == seeds
    users = json.loads(conf.read_text())["authorization"]["users"]
    assert len(users) == 7
    assert not any(seed.strip().decode() in conf.read_text() for seed in seeds.values()), "a seed in the config"


def test_a_bundle_gives_each_host_only_its_own_secrets(tmp_path: Path) -> None:
    hosts = write_bundle(tmp_path / "out", ["n1", "n2"], ["a:6222", "b:6222", "c:6222"])
    files = {host: sorted(path.name for path in directory.iterdir()) for host, directory in hosts.items()}
    assert files == {
        "nats-server": ["admin.nk", "cluster-1.conf", "cluster-2.conf", "cluster-3.conf", REGISTRY, SERVER_CONFIG],
        "control": ["admin.nk", "api.nk", "master.nk"],
        "n1": ["runner-n1.nk", "worker-n1.nk"],
        "n2": ["runner-n2.nk", "worker-n2.nk"],
    }
    second = json.loads((hosts["nats-server"] / "cluster-2.conf").read_text())["cluster"]
    assert second["listen"] == "0.0.0.0:6222" and len(second["routes"]) == 3
    assert second["authorization"]["password"] in second["routes"][0]
    assert len(json.loads((hosts["nats-server"] / SERVER_CONFIG).read_text())["authorization"]["users"]) == 7


def test_each_service_connects_as_itself_or_is_told_what_to_make(tmp_path: Path) -> None:
    config = msgspec.structs.replace(DEFAULTS, data_dir=str(tmp_path), nats_url="nats://elsewhere:4222")
    assert nats_identity(config, Identity("master")) is ANONYMOUS  # no identities: an open server
    ensure_identities(tmp_path / "nats-credentials", CONTROL)  # what `shoal nats` on this data dir made
    master = nats_identity(config, Identity("master"))
    assert master.nkey_seed_file == str(seed_path(tmp_path / "nats-credentials", Identity("master")))
    assert master.inbox_prefix == "_INBOX.master" and not master.manage_streams
    assert nats_identity(config, Identity("admin")).manage_streams
    with pytest.raises(CredentialsError, match=r"worker-n9.*shoal nats --nodes"):
        nats_identity(config, Identity("worker", "n9"))


def test_a_runner_gets_paths_in_its_environment_never_a_secret(tmp_path: Path) -> None:
    ensure_identities(tmp_path, node_identities("n1"))
    path = seed_path(tmp_path, Identity("runner", "n1"))
    identity = NatsIdentity(nkey_seed_file=str(path), inbox_prefix="_INBOX.runner-n1", manage_streams=False)
    endpoint = NatsEndpoint(url="tls://h:4222", tls=TlsFiles(ca="/ca.pem"), identity=identity)
    env = endpoint.child_env()
    assert not any(path.read_bytes().strip().decode() in value for value in env.values())
    assert NatsEndpoint.from_env(endpoint.url, env) == endpoint
    assert NatsEndpoint.from_env("nats://h:4222", {}) == NatsEndpoint(url="nats://h:4222", identity=ANONYMOUS)


def test_a_role_endpoint_carries_the_tls_files_and_its_identity(tmp_path: Path) -> None:
    config = msgspec.structs.replace(DEFAULTS, data_dir=str(tmp_path), nats_url="tls://bus:4222", nats_tls_ca="/ca.pem")
    ensure_identities(tmp_path / "nats-credentials", CONTROL)
    endpoint = endpoint_for(config, Identity("api"))
    assert endpoint.url == "tls://bus:4222" and endpoint.tls == TlsFiles(ca="/ca.pem")
    assert endpoint.identity == nats_identity(config, Identity("api"))
    assert endpoint.identity.inbox_prefix == "_INBOX.api"


def test_identity_names_round_trip_and_refuse_nonsense() -> None:
    for identity in (*CONTROL, *node_identities("node-0")):
        assert Identity.parse(identity.name) == identity
    with pytest.raises(ValueError, match="needs"):
        Identity("worker")
    with pytest.raises(ValueError, match="not a shoal identity"):
        Identity.parse("root")
    with pytest.raises(ValueError, match="not a valid id"):
        Identity("runner", "a.b")


def test_the_bundle_command_says_where_each_directory_and_the_tls_files_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(out=tmp_path / "bundle", nodes="node-a", routes="")
    assert credentials_command(args) == 0
    said = capsys.readouterr().out
    assert "node-a/  -> node node-a" in said
    assert "nats_tls_ca" in said and "nats_tls_cert" in said and "nats_tls_key" in said
