"""Where `replay` and `diagnose` read the log from: an export file, or JetStream live.

`diagnose` may name neither: it then reads the configured cluster, resolved like every other
command resolves it (`nats_url`, else the embedded server at `nats_host:nats_port`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from eventlog.endpoint import NatsEndpoint
from events.codec import ExportRecord
from services.ops.load import ExportReader, SkippedLines

if TYPE_CHECKING:
    from services.config import ResolvedConfig, ShoalConfig

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
CONNECT_TIMEOUT_S = 5.0


class SourceError(Exception):
    """The log cannot be read at all (missing file, NATS unreachable): say what to do."""


def add_source_arguments(parser: argparse.ArgumentParser, *, default_to_config: bool = False) -> None:
    """`--file` or `--nats-url`; with `default_to_config`, neither means the configured cluster
    (and `--config FILE` picks the YAML file that configures it)."""
    source = parser.add_mutually_exclusive_group(required=not default_to_config)
    source.add_argument("--file", type=Path, help="an export file (JSON Lines, from `shoal events export`)")
    live_help = "read SHOAL_EVENTS and SHOAL_TELEMETRY live from this NATS server"
    if default_to_config:
        live_help += " (default: the configured cluster: nats_url, else the embedded server at nats_host:nats_port)"
        parser.add_argument("--config", metavar="FILE", default=None, help="YAML config file (default: ./shoal.yaml)")
    source.add_argument("--nats-url", help=live_help)


class FileSource:
    live = False

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise SourceError(f"no export file at {path}: write one with `shoal events export > FILE`")
        self.path = path
        self._reader: ExportReader | None = None

    def records(self) -> Iterator[tuple[int, ExportRecord]]:
        self._reader = ExportReader(self.path)
        return iter(self._reader)

    def abandon(self, line: int, reason: str) -> None:
        if self._reader is not None:
            self._reader.abandon(line, reason)

    @property
    def skipped(self) -> SkippedLines | None:
        return self._reader.skipped if self._reader is not None else None


class LiveSource:
    """Both streams read once to their current end (in memory: a live log is bounded by retention)."""

    live = True

    def __init__(self, nats: NatsEndpoint) -> None:
        self.url = nats.url
        self._records = asyncio.run(_read_live(nats))
        self.skipped: SkippedLines | None = None

    def records(self) -> Iterable[tuple[int, ExportRecord]]:
        return enumerate(self._records, 1)

    def abandon(self, line: int, reason: str) -> None:
        self.skipped = SkippedLines(line=line, reason=reason, lines_not_used=len(self._records) - line + 1)


async def _read_live(nats: NatsEndpoint) -> list[ExportRecord]:
    from eventlog.log import EventLog, LogError  # NATS client only when asked to go live

    url = nats.url
    try:
        # EventLog.connect keeps retrying an unreachable server; an operator's command must not hang.
        log = await asyncio.wait_for(EventLog.connect(nats, ensure=False, name="shoal-ops"), CONNECT_TIMEOUT_S)
    except (LogError, TimeoutError) as exc:
        reason = str(exc) or f"no answer within {CONNECT_TIMEOUT_S:.0f}s"
        raise SourceError(f"cannot connect to NATS at {url}: {reason}; is the server running?") from exc
    try:
        records: list[ExportRecord] = []
        for stream in ("events", "telemetry"):
            records += [
                ExportRecord(stream=stream, seq=seq, event=event, subject=subject.decode(errors="replace"))
                async for seq, event, subject in log.deliveries(stream=stream, live=False)
            ]
    except LogError as exc:
        raise SourceError(str(exc)) from exc
    finally:
        await log.close()
    return records


def open_source(args: argparse.Namespace) -> FileSource | LiveSource:
    file: Path | None = args.file
    if file is not None:
        return FileSource(file)
    if args.nats_url is not None:  # that server, with this host's TLS files and admin identity
        return LiveSource(operator_endpoint(_resolved(args).config))
    return configured_source(args)


def operator_endpoint(config: ShoalConfig) -> NatsEndpoint:
    """How an operator's tool connects: the admin identity of this host's config, if it has
    identities (operators read everything)."""
    from services.credentials import CredentialsError, endpoint_for
    from services.nats_permissions import Identity

    try:
        return endpoint_for(config, Identity("admin"))
    except CredentialsError as exc:
        raise SourceError(str(exc)) from exc


def _resolved(args: argparse.Namespace) -> ResolvedConfig:
    from services.config import ConfigError, config_from_args  # the config only when going live

    try:
        return config_from_args(args)
    except ConfigError as exc:
        raise SourceError(str(exc)) from exc


def configured_source(args: argparse.Namespace) -> LiveSource:
    """The cluster this machine's config points at: the same resolution as `shoal events tail`."""
    resolved = _resolved(args)
    config = resolved.config
    if config.nats_url:
        origin = f"nats_url from {resolved.sources['nats_url']}"
    else:
        origin = f"no nats_url set: the embedded server's address, nats_port from {resolved.sources['nats_port']}"
    try:
        return LiveSource(operator_endpoint(config))
    except SourceError as exc:
        raise SourceError(
            f"no --file or --nats-url given, and the configured cluster ({origin}) does not answer: {exc} "
            "Start it (`shoal up`, or `shoal nats` and the services), name a server with --nats-url URL, "
            "or read an export with --file FILE."
        ) from exc


def parse_at(text: str) -> tuple[int | None, int | None]:
    """`--at`: an event sequence number, or an ISO time (naive means UTC). Returns (seq, wall_ns)."""
    if text.isdigit():
        return int(text), None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise SourceError(
            f"--at {text!r}: give an event sequence number or an ISO time like 2026-01-01T12:00:05Z"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return None, (moment - EPOCH) // dt.timedelta(microseconds=1) * 1000
