"""Stream settings for the log: retention, replicas and the de-duplication window (docs/ARCHITECTURE.md §2).

`services.config.log_settings(config)` builds `LogSettings` from the shoal config;
`create_stream` is the one place a stream is created.
"""

from __future__ import annotations

import asyncio

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig

from events.subjects import EVENTS_STREAM, EVENTS_SUBJECTS, TELEMETRY_STREAM, TELEMETRY_SUBJECTS
from events.vocabulary import StreamKey

DAY_S = 86_400.0
GIB = 1 << 30
LEASE_BUCKET = "SHOAL_LEASES"  # JetStream KV: the masters' leadership lease (services/master/lease.py)
MASTER_LEASE_KEY = "master"


class StreamLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Limits of one stream; the oldest messages go first when one is exceeded (-1 = unlimited)."""

    max_age_seconds: float
    max_bytes: int = -1
    max_msgs: int = -1


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the log's streams are configured. The defaults are safe for one machine.

    - `events`: SHOAL_EVENTS, 7 days / 1 GiB.
    - `telemetry`: SHOAL_TELEMETRY (heartbeats), 1 hour / 256 MiB.
    - `replicas`: 1 on one server, 3 on a 3-node cluster (compose.nats.yaml).
    - `duplicate_window_seconds`: how long a `Nats-Msg-Id` is remembered; a retry within it is
      stored once.
    - `retry_seconds`: how long an append keeps retrying (same id) while NATS is unreachable,
      and how long a bounded replay waits for a server to come back.
    """

    events: StreamLimits = StreamLimits(max_age_seconds=7 * DAY_S, max_bytes=GIB)
    telemetry: StreamLimits = StreamLimits(max_age_seconds=3600.0, max_bytes=256 << 20)
    replicas: int = 1
    duplicate_window_seconds: float = 120.0
    retry_seconds: float = 30.0


def stream_name(key: StreamKey) -> str:
    return EVENTS_STREAM if key == "events" else TELEMETRY_STREAM


def stream_config(key: StreamKey, settings: LogSettings) -> StreamConfig:
    limits = settings.events if key == "events" else settings.telemetry
    subjects = EVENTS_SUBJECTS if key == "events" else TELEMETRY_SUBJECTS
    window = (
        min(settings.duplicate_window_seconds, limits.max_age_seconds)
        if limits.max_age_seconds > 0
        else (settings.duplicate_window_seconds)
    )
    return StreamConfig(
        name=stream_name(key),
        subjects=[subjects],
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        storage=StorageType.FILE,
        max_age=limits.max_age_seconds if limits.max_age_seconds > 0 else None,
        max_bytes=limits.max_bytes,
        max_msgs=limits.max_msgs,
        num_replicas=settings.replicas,
        duplicate_window=window,
        allow_direct=True,
    )


def lease_bucket_config(settings: LogSettings) -> KeyValueConfig:
    """The lease bucket: one value per key (no history), as many replicas as the log, read directly."""
    return KeyValueConfig(
        bucket=LEASE_BUCKET, history=1, replicas=settings.replicas, storage=StorageType.FILE, direct=True
    )


STORE_BUSY_ERR_CODE = 10049  # JetStream: "error creating store for stream"
STORE_BUSY_RETRIES = 8


async def create_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create a stream. Right after a delete of the same name the server may still be removing the
    old store ("error creating store for stream"), so that one error is retried briefly."""
    for attempt in range(STORE_BUSY_RETRIES):
        try:
            await js.add_stream(config)  # pyright: ignore[reportUnknownMemberType]
            return
        except nats.js.errors.ServerError as err:
            if err.err_code != STORE_BUSY_ERR_CODE or attempt == STORE_BUSY_RETRIES - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
