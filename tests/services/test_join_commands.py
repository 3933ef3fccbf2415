"""`shoal nats token create|ls|revoke` and `shoal worker --join` as a user types them, on files
only (no server: the joins themselves are tests/security/test_join.py's)."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import pytest

from services.cli import build_parser
from services.commands.join_cmd import joined_config
from services.config import resolve_config
from services.credentials import JOIN_IDENTITY, embedded_server, seed_path
from services.join_client import JOINED_FILE, Joined, JoinRefused
from services.join_desk import read_tokens
from services.join_tokens import BadToken, decode_token, token_state


def _run(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    handler = args.handler
    return int(handler(args))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A control host's data dir whose server was started once (it makes the join identity)."""
    config = resolve_config({"data_dir": str(tmp_path)}, env={}).config
    embedded_server(config, ["node-0"])
    assert seed_path(tmp_path / "nats-credentials", JOIN_IDENTITY).is_file()
    return tmp_path


def test_create_list_and_revoke_a_token(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("nats", "token", "create", "--data-dir", str(data_dir), "--ttl", "30m", "--node", "gpu-3") == 0
    out, err = capsys.readouterr()
    token = decode_token(out.strip())
    assert token.node == "gpu-3" and token.ca_sha256 == b""  # no TLS here: nothing to pin
    assert "shoal worker --join nats://" in err and "--token" in err
    store = read_tokens(data_dir / "nats-credentials")
    assert token.secret.hex() not in (data_dir / "nats-credentials" / "join-tokens.json").read_text()
    assert (data_dir / "nats-credentials" / "join-tokens.json").stat().st_mode & 0o777 == 0o600
    record = store.tokens[token.token_id]
    assert record.expires - record.created == 1800
    assert _run("nats", "token", "ls", "--data-dir", str(data_dir)) == 0
    listed = capsys.readouterr().out
    assert token.token_id in listed and "valid" in listed and "gpu-3" in listed
    assert _run("nats", "token", "revoke", token.token_id, "--data-dir", str(data_dir)) == 0
    revoked = read_tokens(data_dir / "nats-credentials").tokens[token.token_id]
    assert token_state(revoked, revoked.created) == "revoked"
    capsys.readouterr()
    assert _run("nats", "token", "revoke", "nope", "--data-dir", str(data_dir)) == 2
    assert "token ls" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--ttl", "1w"], "e.g. 30m"),
        (["--ttl", "30d"], "at most"),
        (["--node", "a.b"], "--node"),
    ],
)
def test_create_refuses_what_it_cannot_make(
    data_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert _run("nats", "token", "create", "--data-dir", str(data_dir), *argv) == 2
    assert says in capsys.readouterr().err


def test_create_before_the_server_made_the_join_identity_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run("nats", "token", "create", "--data-dir", str(tmp_path)) == 2
    assert "start the server once" in capsys.readouterr().err


def test_a_tls_server_without_its_ca_cannot_pin_it(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert = data_dir / "c.pem"
    cert.write_text("x")
    argv = ["nats", "token", "create", "--data-dir", str(data_dir)]
    args = build_parser().parse_args(argv)
    args.nats_tls_cert, args.nats_tls_key = str(cert), str(cert)
    assert int(args.handler(args)) == 2
    assert "set nats_tls_ca" in capsys.readouterr().err


def test_a_host_that_joined_serves_again_without_the_token(tmp_path: Path) -> None:
    directory = tmp_path / "nats-credentials"
    directory.mkdir()
    url = "tls://control:4222"
    pinned = directory / "ca.pem"
    joined = Joined(url=url, node="gpu-3", token_id="abc", ca=str(pinned))
    (directory / JOINED_FILE).write_bytes(msgspec.json.encode(joined))
    resolved, node = joined_config(resolve_config({"data_dir": str(tmp_path)}, env={}), url, None, None)
    assert node == "gpu-3"
    config = resolved.config
    assert (config.nats_url, config.nats_credentials_dir, config.nats_tls_ca) == (url, str(directory), str(pinned))
    assert resolved.sources["nats_tls_ca"] == "joined with a token (--join)"
    with pytest.raises(JoinRefused, match=r"joined tls://control:4222 as node 'gpu-3'.*--node-id gpu-3"):
        joined_config(resolve_config({"data_dir": str(tmp_path)}, env={}), url, None, "other")
    with pytest.raises(JoinRefused, match="has not joined tls://elsewhere:4222 yet: give --token"):
        joined_config(resolve_config({"data_dir": str(tmp_path)}, env={}), "tls://elsewhere:4222", None, None)


def test_join_refuses_a_second_server_url_and_a_damaged_token(tmp_path: Path) -> None:
    with pytest.raises(JoinRefused, match="leave out --nats-url"):
        joined_config(
            resolve_config({"data_dir": str(tmp_path), "nats_url": "nats://x:4222"}, env={}),
            "nats://y:4222",
            None,
            None,
        )
    with pytest.raises(BadToken, match="not a shoal join token"):
        joined_config(resolve_config({"data_dir": str(tmp_path)}, env={}), "nats://y:4222", "hello", None)


def test_the_worker_flags_go_together(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path))  # the command sets it for its children: put back after
    args = build_parser().parse_args(["worker", "--token", "x"])
    assert isinstance(args, argparse.Namespace)
    assert int(args.handler(args)) == 1
    assert "--token goes with --join" in capsys.readouterr().err
