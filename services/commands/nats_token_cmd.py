"""`shoal nats token create|ls|revoke` and `shoal nats revoke-node`: admitting machines with
one-time tokens, and cutting one off (README "Adding a machine"; `services/join_desk.py`).

They act on the identity directory of the server embedded on this host (`nats_credentials_dir`,
else `<data_dir>/nats-credentials`), so they run on the control host, beside `shoal nats` or
`shoal up`."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from eventlog.log import EventLog, LogError
from events.catalogue import NodeLeft, Origin
from events.ids import InvalidId, NodeId, check_token
from events.origins import OPERATOR
from events.stamp import Stamper
from services.config import ConfigError, ShoalConfig, add_setting_flag, config_from_args
from services.credentials import CredentialsError, embedded_credentials_dir, endpoint_for
from services.join_desk import ca_fingerprint, create_token, read_tokens, revoke_node, revoke_token
from services.join_tokens import MAX_TTL_SECONDS, UnknownToken, encode_token, token_state
from services.nats import EmbeddedNats, is_loopback
from services.nats_errors import NatsError
from services.nats_permissions import Identity

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> float:
    """`90s`, `30m`, `1h`, `2d` -> seconds; ValueError saying how to write one."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"--ttl {text!r}: write a number and a unit, e.g. 30m, 1h, 2d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def register(actions: Any) -> None:
    """The token and revoke-node actions under `shoal nats`."""
    token = actions.add_parser("token", help="one-time tokens a new machine joins with (`shoal worker --join`)")
    token_actions = token.add_subparsers(dest="token_action", metavar="ACTION", required=True)
    create = token_actions.add_parser("create", help="print a new one-time join token")
    create.add_argument(
        "--ttl", default="1h", help=f"how long it may be used (default 1h, at most {MAX_TTL_SECONDS // 86400}d)"
    )
    create.add_argument("--node", default="", help="the node id it admits (default: any id not admitted yet)")
    _add_server_flags(create)
    create.set_defaults(handler=create_command)
    listing = token_actions.add_parser("ls", help="every token: valid, used (by which node), expired or revoked")
    _add_server_flags(listing)
    listing.set_defaults(handler=ls_command)
    revoke = token_actions.add_parser("revoke", help="make a token unusable")
    revoke.add_argument("token_id", metavar="ID", help="the id `shoal nats token ls` shows")
    _add_server_flags(revoke)
    revoke.set_defaults(handler=revoke_command)
    node = actions.add_parser(
        "revoke-node", help="stop admitting a node: its connections are closed, the master retires it"
    )
    _add_server_flags(node)
    node.add_argument("node", metavar="NAME", help="the node id")
    node.add_argument("--reason", default="", help="why, recorded in its NodeLeft (shown by `shoal diagnose`)")
    node.set_defaults(handler=revoke_node_command)


def _add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML config file (default: ./shoal.yaml)")
    add_setting_flag(parser, "data_dir", "the data dir of the embedded server (`shoal nats`, `shoal up`)")
    add_setting_flag(
        parser, "nats_credentials_dir", "identities the server admits (default <data_dir>/nats-credentials)"
    )


def _config(args: argparse.Namespace, command: str) -> ShoalConfig | None:
    try:
        return config_from_args(args).config
    except ConfigError as exc:
        print(f"shoal nats {command}: {exc}", file=sys.stderr)
        return None


def create_command(args: argparse.Namespace) -> int:
    config = _config(args, "token create")
    if config is None:
        return 2
    try:
        ttl = parse_ttl(str(args.ttl))
        node = check_token("--node", args.node) if args.node else ""
        pin = _ca_pin(config)
        token, record = create_token(
            embedded_credentials_dir(config), node=node, ttl_seconds=ttl, ca_sha256=pin, now=time.time()
        )
    except (ValueError, InvalidId, CredentialsError, OSError) as exc:
        print(f"shoal nats token create: {exc}", file=sys.stderr)
        return 2
    print(encode_token(token))
    until = _when(record.expires)
    who = f"node {node!r}" if node else "one machine (any node id not admitted yet)"
    print(f"token {record.token_id}: admits {who}, once, until {until}. On the new machine:", file=sys.stderr)
    node_flag = "" if node else " [--node-id NAME]"
    print(f"  shoal worker --join {_join_url(config)} --token <the token above>{node_flag}", file=sys.stderr)
    if is_loopback(config.nats_host):
        print(
            f"  note: the server listens on {config.nats_host} (nats_host), which no other machine reaches: "
            "run `shoal nats` with --nats-host set to an address they do (TLS off loopback: `shoal nats certs`)",
            file=sys.stderr,
        )
    return 0


def _ca_pin(config: ShoalConfig) -> bytes:
    """The pin of the CA a TLS server's certificate is signed by; none without TLS."""
    if not config.nats_tls.has_identity:
        return b""
    if not config.nats_tls_ca:
        raise ValueError(
            "this server serves TLS, and a joining machine must be able to verify it: set nats_tls_ca to the CA "
            "that signed nats_tls_cert (the token carries its fingerprint)"
        )
    return ca_fingerprint(config.nats_tls_ca)


def _join_url(config: ShoalConfig) -> str:
    host = config.nats_host
    if host in ("0.0.0.0", "::") or is_loopback(host):
        host = socket.gethostname()  # the address others reach: the loopback one reaches only this host
    return f"{'tls' if config.nats_tls.has_identity else 'nats'}://{host}:{config.nats_port}"


def _when(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ls_command(args: argparse.Namespace) -> int:
    config = _config(args, "token ls")
    if config is None:
        return 2
    store = read_tokens(embedded_credentials_dir(config))
    now = time.time()
    if not store.tokens:
        print("no join tokens (`shoal nats token create` makes one)")
        return 0
    print(f"{'ID':<14} {'STATE':<8} {'NODE':<16} {'EXPIRES':<24} USED BY")
    for record in sorted(store.tokens.values(), key=lambda r: r.created):
        state = token_state(record, now)
        print(
            f"{record.token_id:<14} {state:<8} {record.node or '(any)':<16} {_when(record.expires):<24} {record.used_by}"
        )
    return 0


def revoke_command(args: argparse.Namespace) -> int:
    config = _config(args, "token revoke")
    if config is None:
        return 2
    try:
        revoke_token(embedded_credentials_dir(config), str(args.token_id), time.time())
    except UnknownToken:
        print(f"shoal nats token revoke: no token {args.token_id!r}; `shoal nats token ls` lists them", file=sys.stderr)
        return 2
    print(f"token {args.token_id} revoked: no machine can join with it")
    return 0


def revoke_node_command(args: argparse.Namespace) -> int:
    config = _config(args, "revoke-node")
    if config is None:
        return 2
    try:
        node = check_token("node id", str(args.node))
    except InvalidId as exc:
        print(f"shoal nats revoke-node: {exc}", file=sys.stderr)
        return 2
    directory = embedded_credentials_dir(config)
    store_dir = EmbeddedNats(data_dir=config.data_path).store_dir
    try:
        removed, reloaded = revoke_node(directory, store_dir, node)
    except NatsError as exc:
        print(f"shoal nats revoke-node: {exc}", file=sys.stderr)
        return 1
    if not removed:
        print(f"shoal nats revoke-node: the server in {directory} admits no identity of node {node!r}", file=sys.stderr)
        return 2
    if not reloaded:
        print(
            f"node {node!r} revoked ({', '.join(removed)}); no server runs on {store_dir}: the next one admits it no more"
        )
        return 0
    print(f"node {node!r} revoked: the server dropped its connections ({', '.join(removed)})")
    reason = args.reason or "revoked by the operator (`shoal nats revoke-node`)"
    try:
        said = asyncio.run(_say_node_left(config, directory, node, reason))
    except (LogError, CredentialsError) as exc:
        print(
            f"shoal nats revoke-node: could not record that it left ({exc}); the master times it out", file=sys.stderr
        )
        return 1
    print(f"  the master retires its instances; {said}")
    return 0


async def _say_node_left(config: ShoalConfig, directory: Path, node: str, reason: str) -> str:
    """Append `NodeLeft` for a node that is up in the log, as the operator (the node cannot)."""
    with_dir = msgspec.structs.replace(config, nats_credentials_dir=str(directory))
    log = await EventLog.connect(endpoint_for(with_dir, Identity("admin")), ensure=False, name="shoal-revoke-node")
    try:
        state = await log.fold(from_snapshot=True)
        known = state.nodes.get(NodeId(node))
        if known is None or known.status != "up":
            return "it was not up in the log (nothing to record)"
        left = NodeLeft(env=Stamper(Origin(service=OPERATOR)).stamp(), node_id=NodeId(node), reason=reason)
        seq = await log.append(left)
        return f"NodeLeft recorded at seq {seq}"
    finally:
        await log.close()
