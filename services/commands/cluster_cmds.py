"""`shoal up`, `shoal master`, `shoal worker`, `shoal api`: the cluster's services."""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from eventlog.log import LogError
from events.ids import InvalidId, check_token
from services.commands.join_cmd import BadToken, JoinRefused, add_join_flags, joined_config
from services.commands.nats_cmd import add_insecure_plaintext_flag
from services.config import (
    ConfigError,
    ResolvedConfig,
    add_common_flags,
    add_models_flag,
    add_setting_flag,
    config_from_args,
)
from services.config_files import check_data_dir
from services.credentials import CredentialsError
from services.log_routing import configure_logging
from services.nats_errors import NatsError
from services.stop_signals import until_stopped
from services.supervise import supervise


def register(subparsers: Any) -> None:
    up = subparsers.add_parser("up", help="run a whole cluster on this machine: NATS, master, workers, API")
    add_common_flags(up)
    add_setting_flag(up, "workers", "worker nodes to start (default 2: the model runs as a 2-rank pipeline)")
    add_setting_flag(up, "masters", "masters to start (default 1; more stand by to take over)")
    add_models_flag(up, "a model to serve: `tiny`, an mlx-lm model directory or a Hub id (repeat for several)")
    up.add_argument("--port", dest="api_port", default=None, help="API port (default 8000)")
    add_setting_flag(up, "nats_port", "embedded NATS client port (default 4222)")
    add_setting_flag(up, "data_dir", "where the embedded NATS stores the log")
    add_insecure_plaintext_flag(up)
    up.set_defaults(handler=_up)

    master = subparsers.add_parser("master", help="run the master (placement, assignment, watchdog)")
    add_common_flags(master)
    add_models_flag(master, "a model kept placed once nodes join (repeat for several)")
    master.set_defaults(handler=functools.partial(_serve, role="master"))

    worker = subparsers.add_parser("worker", help="run a worker for this node (one runner process per rank)")
    add_common_flags(worker)
    worker.add_argument("--node-id", default=None, help="node id (default: the host name)")
    worker.add_argument("--host", default="127.0.0.1", help="address peers reach this node's ring ports on")
    add_setting_flag(worker, "node_memory_bytes", "memory this node offers to placement (default: what is available)")
    add_join_flags(worker)
    worker.set_defaults(handler=functools.partial(_serve, role="worker"))

    api = subparsers.add_parser("api", help="run the OpenAI-compatible HTTP API")
    add_common_flags(api)
    api.add_argument("--port", dest="api_port", default=None, help="API port (default 8000)")
    add_models_flag(api, "a model the API offers (repeat for several)")
    api.set_defaults(handler=functools.partial(_serve, role="api"))


def _resolve(args: argparse.Namespace, command: str) -> ResolvedConfig | None:
    try:
        resolved = config_from_args(args)
        configure_logging(resolved.config)
    except ConfigError as exc:
        print(f"shoal {command}: {exc}", file=sys.stderr)
        return None
    # One data dir for everything this process and its children keep (the NATS store, the tiny model).
    os.environ["SHOAL_DATA_DIR"] = str(resolved.config.data_path)
    return resolved


def _up(args: argparse.Namespace) -> int:
    from services.models import prepare_tiny
    from services.up import up

    resolved = _resolve(args, "up")
    if resolved is None:
        return 2
    try:
        check_data_dir(resolved.config.data_path, resolved.sources.get("data_dir", "default"))
        for model in resolved.config.models:
            prepare_tiny(model)
        return up(resolved, resolved.config.workers, insecure_plaintext=args.insecure_plaintext)
    except (NatsError, LogError, ConfigError, CredentialsError) as exc:
        print(f"shoal up: {exc}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace, role: str) -> int:
    from services import roles
    from services.api.auth import load_api_access
    from services.worker.service import default_node_id

    resolved = _resolve(args, role)
    if resolved is None:
        return 2
    if role == "worker" and (args.join or args.token):
        try:
            if not args.join:
                raise JoinRefused("--token goes with --join URL (the control host's NATS server)")
            resolved, args.node_id = joined_config(resolved, args.join, args.token, args.node_id)
        except (JoinRefused, BadToken, InvalidId, CredentialsError) as exc:
            print(f"shoal worker: {exc}", file=sys.stderr)
            return 1
    elif not resolved.config.nats_url:
        print(
            f"shoal {role}: note: no --nats-url/SHOAL_NATS_URL given; using {resolved.config.client_nats_url}",
            file=sys.stderr,
        )
    try:  # node ids are NATS subject tokens: a dot or a space would break every subject of the node
        node_id = check_token("--node-id", args.node_id or default_node_id()) if role == "worker" else ""
    except InvalidId as exc:
        print(f"shoal worker: {exc}", file=sys.stderr)
        return 2
    runs: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
        "master": lambda: roles.run_master(resolved),
        "worker": lambda: roles.run_worker(resolved, node_id, host=args.host),
        "api": lambda: roles.run_api_process(resolved, load_api_access(resolved)),
    }
    # A NATS outage, a refused write or a follow that ends costs a restart with backoff (logged as
    # degraded), never the process; only a configuration mistake, which no retry cures, ends it.
    try:
        asyncio.run(until_stopped(supervise(f"shoal {role}", runs[role], fatal=(ConfigError, CredentialsError))))
    except KeyboardInterrupt:  # before the loop ran
        return 0
    except (ConfigError, CredentialsError) as exc:
        print(f"shoal {role}: {exc}", file=sys.stderr)
        return 1
    return 0
