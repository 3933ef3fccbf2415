"""What the admin creates before any service starts, and deletes for tests or an import: both
streams, the masters' lease bucket and the snapshot store (docs/ARCHITECTURE.md §2, §3). Only the
admin identity may (`services/nats_permissions.py`); `EventLog.ensure_streams` calls these."""

from __future__ import annotations

import contextlib

import nats.errors
import nats.js.errors
from loguru import logger
from nats.js import JetStreamContext

from eventlog.publish import LogError
from eventlog.snapshots import delete_snapshot_bucket, ensure_snapshot_bucket
from eventlog.streams import LEASE_BUCKET, LogSettings, create_stream, lease_bucket_config, stream_config, stream_name
from events.vocabulary import StreamKey

STREAM_KEYS: tuple[StreamKey, ...] = ("events", "telemetry")


async def ensure_log_storage(js: JetStreamContext, settings: LogSettings) -> None:
    """Create SHOAL_EVENTS and SHOAL_TELEMETRY or update them to the settings (idempotent), the
    lease bucket if missing, and the snapshot store. A server without JetStream is a `LogError`."""
    try:
        await _ensure(js, settings)
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError) as exc:
        raise LogError(
            "the NATS server answers but its JetStream does not (not enabled, or a cluster with no meta leader "
            "yet): run nats-server with -js (shoal's own, with nats_urls empty, has it)"
        ) from exc


async def _ensure(js: JetStreamContext, settings: LogSettings) -> None:
    for key in STREAM_KEYS:
        config = stream_config(key, settings)
        try:
            await js.stream_info(stream_name(key))
        except nats.js.errors.NotFoundError:
            await create_stream(js, config)
            logger.debug("created stream {}", config.name)
        else:
            await js.update_stream(config)  # pyright: ignore[reportUnknownMemberType]
    try:
        await js.key_value(LEASE_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        await js.create_key_value(lease_bucket_config(settings))  # pyright: ignore[reportUnknownMemberType]
    await ensure_snapshot_bucket(js, settings)


async def delete_log_storage(js: JetStreamContext) -> None:
    """Delete both streams, the lease bucket and the snapshots; `ensure_log_storage` recreates them."""
    for key in STREAM_KEYS:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream_name(key))
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_key_value(LEASE_BUCKET)
    await delete_snapshot_bucket(js)


async def reset_stream(js: JetStreamContext, stream: StreamKey, settings: LogSettings, *, first_seq: int = 1) -> None:
    """Delete one stream and create it empty, its first message to get `first_seq` (imports)."""
    config = stream_config(stream, settings)
    config.first_seq = first_seq if first_seq > 1 else None
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream(stream_name(stream))
    await create_stream(js, config)
