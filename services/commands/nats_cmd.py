"""`shoal nats`: run the embedded NATS JetStream server alone, with shoal's streams created and
join requests answered (`services/join_desk.py`); `shoal nats credentials --out DIR --nodes n1,n2`:
the identities of a cluster on several hosts, for air-gapped setups; `shoal nats token ...` and
`revoke-node`: `services/commands/nats_token_cmd.py`."""

from __future__ import annotations

import argparse
import asyncio
import functools
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog, LogError
from events.ids import InvalidId, check_token
from services.commands import nats_token_cmd
from services.config import (
    ConfigError,
    ShoalConfig,
    add_setting_flag,
    config_from_args,
    log_settings,
)
from services.config_files import check_data_dir
from services.credentials import (
    CredentialsError,
    embedded_server,
    endpoint_for,
    write_bundle,
)
from services.join_desk import JoinDesk
from services.log_routing import configure_logging
from services.nats import EmbeddedNats
from services.nats_errors import NatsError
from services.nats_permissions import Identity
from services.stop_signals import until_stopped
from services.supervise import supervise
from services.worker.service import default_node_id


def add_insecure_plaintext_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--insecure-plaintext",
        action="store_true",
        help="serve NATS without TLS on an address other than loopback (only on a network you trust)",
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("nats", help="run the embedded NATS JetStream server (until Ctrl-C)")
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML config file (default: ./shoal.yaml)")
    add_setting_flag(parser, "nats_host", "address to listen on (default 127.0.0.1)")
    add_setting_flag(parser, "nats_port", "client port (default 4222; 0 = any free port)")
    add_setting_flag(parser, "data_dir", "shoal data dir; JetStream stores under <data_dir>/nats")
    add_setting_flag(
        parser, "nats_credentials_dir", "identities the server admits (default <data_dir>/nats-credentials)"
    )
    parser.add_argument(
        "--nodes", default="", help="worker nodes admitted besides this host's (comma-separated node ids)"
    )
    add_insecure_plaintext_flag(parser)
    parser.set_defaults(handler=nats_command)
    actions = parser.add_subparsers(dest="nats_action", metavar="ACTION")
    credentials = actions.add_parser("credentials", help="write every identity of a cluster, one directory per host")
    credentials.add_argument("--out", required=True, type=Path, help="directory to write into (must not exist)")
    credentials.add_argument("--nodes", required=True, help="the worker nodes' ids, comma-separated")
    credentials.add_argument(
        "--routes", default="", help="a NATS cluster's servers, host:cluster-port comma-separated (compose.nats.yaml)"
    )
    credentials.set_defaults(handler=credentials_command)
    certs = actions.add_parser("certs", help="make a private CA and a TLS certificate per host (a home cluster)")
    certs.add_argument("--out", required=True, type=Path, help="directory to write into (must not exist)")
    certs.add_argument(
        "--hosts", required=True, help="the names or addresses clients reach each host by, comma-separated"
    )
    certs.set_defaults(handler=certs_command)
    nats_token_cmd.register(actions)


def _node_ids(text: str) -> list[str]:
    return [check_token("node id", node.strip()) for node in text.split(",") if node.strip()]


def credentials_command(args: argparse.Namespace) -> int:
    out: Path = args.out
    try:
        nodes = _node_ids(str(args.nodes))
    except InvalidId as exc:
        print(f"shoal nats credentials: {exc}", file=sys.stderr)
        return 2
    if not nodes or out.exists():
        why = "give at least one node id" if not nodes else f"{out} exists; choose a new directory"
        print(f"shoal nats credentials: {why}", file=sys.stderr)
        return 2
    routes = [route.strip() for route in str(args.routes).split(",") if route.strip()]
    hosts = write_bundle(out, nodes, routes)
    print(f"shoal nats credentials: wrote {out} (every file 0600: copy each directory to its host only)")
    for host, directory in hosts.items():
        print(f"  {directory}/  -> {_where(host)}")
    print(
        "  TLS (optional, not in this bundle): give each host nats_tls_ca (the CA that signed the NATS "
        "servers' certificates) and, for mutual TLS, its own nats_tls_cert and nats_tls_key; each NATS "
        "host serves its own (`shoal nats` with the same settings; a bare nats-server, a tls block)"
    )
    return 0


def certs_command(args: argparse.Namespace) -> int:
    from services.nats_certs import CA_CERT, CA_KEY, host_files, write_certs

    out: Path = args.out
    hosts = [host.strip() for host in str(args.hosts).split(",") if host.strip()]
    try:
        write_certs(out, hosts)
    except ValueError as exc:
        print(f"shoal nats certs: {exc}", file=sys.stderr)
        return 2
    print(f"shoal nats certs: wrote {out} (keys 0600). On every host: nats_tls_ca: {out / CA_CERT}")
    for host in hosts:
        cert, key = host_files(host)
        print(f"  {host}: nats_tls_cert: {cert}, nats_tls_key: {key} (copy both to that host only)")
    print(f"  keep {CA_KEY} off the cluster: it signs certificates every host trusts")
    return 0


def _where(host: str) -> str:
    if host == "nats-server":
        return "each NATS host: `shoal nats --nats-credentials-dir DIR`, or nats-server -c DIR/nats-server.conf"
    if host == "control":
        return "the master/API host: nats_credentials_dir: DIR (also the admin, for `shoal events`/`diagnose`)"
    return f"node {host}: `shoal worker --node-id {host}` with nats_credentials_dir: DIR"


SERVER_POLL_SECONDS = 0.5


class _Stop(Exception):
    """SIGTERM arrived."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


async def _ensure_streams(admin: NatsEndpoint, config: ShoalConfig) -> None:
    log = await EventLog.connect(admin, log_settings(config))
    await log.close()


def nats_command(args: argparse.Namespace) -> int:
    try:
        resolved = config_from_args(args)
        config = resolved.config
        configure_logging(config)
        check_data_dir(config.data_path, resolved.sources.get("data_dir", "default"))
        nodes = [default_node_id(), *_node_ids(str(args.nodes))]
    except (ConfigError, InvalidId) as exc:
        print(f"shoal nats: {exc}", file=sys.stderr)
        return 2
    if config.nats_url:
        print(
            f"shoal nats: note: nats_url={config.nats_url!r} is set; `shoal nats` ignores it and runs its own server",
            file=sys.stderr,
        )
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    server: EmbeddedNats | None = None
    try:
        # The control identities and the nodes': `shoal master|api|worker` on this host work as they are.
        server, directory = embedded_server(config, nodes, insecure_plaintext=args.insecure_plaintext)
        server.start()
        admin = endpoint_for(_with_credentials(config, directory), Identity("admin"))
        admin = msgspec.structs.replace(admin, url=server.url)
        desk = JoinDesk(directory=directory, store_dir=server.store_dir, ca_file=config.nats_tls_ca, clock=time.time)
        code = asyncio.run(until_stopped(_serve(server, admin, config, desk, directory)))
        if code is None:
            print("shoal nats: stopping", file=sys.stderr)
            return 0
        print(f"shoal nats: server exited with code {code}", file=sys.stderr)
        return 1
    except (NatsError, LogError, CredentialsError) as exc:
        print(f"shoal nats: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Stop):
        print("shoal nats: stopping", file=sys.stderr)
        return 0
    finally:
        if server is not None:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _serve(
    server: EmbeddedNats, admin: NatsEndpoint, config: ShoalConfig, desk: JoinDesk, directory: Path
) -> int:
    """Streams made, then join requests answered until the server exits: its exit code."""
    await _ensure_streams(admin, config)
    print(
        f"shoal nats: JetStream at {server.url} (store {server.store_dir}; admits the identities in "
        f"{directory}; `shoal nats token create` admits a new machine); Ctrl-C to stop",
        flush=True,
    )
    async with asyncio.TaskGroup() as group:
        # supervised: a desk that loses its connection is started again, never the server's end
        answering = group.create_task(supervise("join desk", functools.partial(desk.serve, admin)))
        while server.running:
            await asyncio.sleep(SERVER_POLL_SECONDS)  # the child process's exit has no event to wait on here
        answering.cancel()
    return server.wait()


def _with_credentials(config: ShoalConfig, directory: Path) -> ShoalConfig:
    return msgspec.structs.replace(config, nats_credentials_dir=str(directory))
