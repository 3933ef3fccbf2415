"""The bus's identities on disk: private files, stable keys, one directory per host, clear errors."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import msgspec
import pytest

from eventlog.connect_options import ANONYMOUS, RUNNER_ENV, ConnectOptions
from services.config import DEFAULTS
from services.credentials import (
    REGISTRY,
    SERVER_CONFIG,
    CredentialsError,
    connect_options,
    ensure_identities,
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
    assert connect_options(config, Identity("master")) is ANONYMOUS  # no identities: an open server
    ensure_identities(tmp_path / "nats-credentials", CONTROL)  # what `shoal nats` on this data dir made
    master = connect_options(config, Identity("master"))
    assert master.nkey_seed_file == str(seed_path(tmp_path / "nats-credentials", Identity("master")))
    assert master.inbox_prefix == "_INBOX.master" and not master.manage_streams
    assert connect_options(config, Identity("admin")).manage_streams
    with pytest.raises(CredentialsError, match=r"worker-n9.*shoal nats --nodes"):
        connect_options(config, Identity("worker", "n9"))


def test_a_runner_gets_paths_in_its_environment_never_a_secret(tmp_path: Path) -> None:
    ensure_identities(tmp_path, node_identities("n1"))
    path = seed_path(tmp_path, Identity("runner", "n1"))
    options = ConnectOptions(nkey_seed_file=str(path), inbox_prefix="_INBOX.runner-n1", manage_streams=False)
    text = options.to_env()
    assert path.read_bytes().strip().decode() not in text
    assert ConnectOptions.from_env({RUNNER_ENV: text}) == options
    assert ConnectOptions.from_env({}) == ANONYMOUS


def test_identity_names_round_trip_and_refuse_nonsense() -> None:
    for identity in (*CONTROL, *node_identities("node-0")):
        assert Identity.parse(identity.name) == identity
    with pytest.raises(ValueError, match="needs"):
        Identity("worker")
    with pytest.raises(ValueError, match="not a shoal identity"):
        Identity.parse("root")
    with pytest.raises(ValueError, match="not a valid id"):
        Identity("runner", "a.b")
