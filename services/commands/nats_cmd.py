"""`shoal nats`: run the embedded NATS JetStream server alone, with shoal's streams created."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from types import FrameType
from typing import Any

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog, LogError
from services.config import ConfigError, add_setting_flag, config_from_args, configure_logging, log_settings
from services.nats import EmbeddedNats, NatsError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("nats", help="run the embedded NATS JetStream server (until Ctrl-C)")
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML config file (default: ./shoal.yaml)")
    add_setting_flag(parser, "nats_host", "address to listen on (default 127.0.0.1)")
    add_setting_flag(parser, "nats_port", "client port (default 4222; 0 = any free port)")
    add_setting_flag(parser, "data_dir", "shoal data dir; JetStream stores under <data_dir>/nats")
    parser.set_defaults(handler=nats_command)


class _Stop(Exception):
    """SIGTERM arrived."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


async def _ensure_streams(nats: NatsEndpoint, args_config: Any) -> None:
    log = await EventLog.connect(nats, log_settings(args_config))
    await log.close()


def nats_command(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args).config
        configure_logging(config)
    except ConfigError as exc:
        print(f"shoal nats: {exc}", file=sys.stderr)
        return 2
    if config.nats_url:
        print(
            f"shoal nats: note: nats_url={config.nats_url!r} is set; `shoal nats` ignores it and runs its own server",
            file=sys.stderr,
        )
    server = EmbeddedNats(data_dir=config.data_path, host=config.nats_host, port=config.nats_port, tls=config.nats_tls)
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        server.start()
        asyncio.run(_ensure_streams(NatsEndpoint(url=server.url, tls=config.nats_tls), config))
        print(f"shoal nats: JetStream at {server.url} (store {server.store_dir}); Ctrl-C to stop", flush=True)
        code = server.wait()
        print(f"shoal nats: server exited with code {code}", file=sys.stderr)
        return 1
    except (NatsError, LogError) as exc:
        print(f"shoal nats: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Stop):
        print("shoal nats: stopping", file=sys.stderr)
        return 0
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
