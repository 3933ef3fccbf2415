"""Snapshots of the State in NATS: the object `state` of the JetStream object store SHOAL_SNAPSHOTS.

An object store, not a KV entry or a stream message, because a State holding a thousand ended
tasks with long prompts can be larger than a NATS message (1 MiB by default): the store chunks it.
One object, overwritten: a service needs only the newest, and the store purges the old chunks.

- The bucket is created with the streams (`EventLog.ensure_streams`, by an identity that manages
  streams), and deleted with them, so a snapshot never outlives the log it was folded from.
- `write_snapshot` is called by the leading master only (`services/master/snapshots.py`): one
  writer, so two never interleave; the State it writes is one every replica would fold.
- `read_snapshot` never fails a start-up: a missing bucket or object, an unreadable object, a
  format this code cannot read, or one folded from another incarnation of SHOAL_EVENTS is logged
  and answered None, and the caller folds the log from its start.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
import nats.js.errors
from loguru import logger
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType

from eventlog.streams import LogSettings, stream_name
from events.snapshot import Snapshot, UnusableSnapshot, decode_snapshot, encode_snapshot
from events.state import State
from events.subjects import SNAPSHOT_BUCKET

SNAPSHOT_OBJECT = "state"
READ_TIMEOUT_SECONDS = 30.0  # a snapshot whose chunks never arrive must not hang a start-up


async def ensure_snapshot_bucket(js: JetStreamContext, settings: LogSettings) -> None:
    """Create SHOAL_SNAPSHOTS unless it exists (idempotent)."""
    try:
        await js.object_store(SNAPSHOT_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        config = ObjectStoreConfig(storage=StorageType.FILE, replicas=settings.replicas)
        await js.create_object_store(SNAPSHOT_BUCKET, config)  # pyright: ignore[reportUnknownMemberType]


async def delete_snapshot_bucket(js: JetStreamContext) -> None:
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_object_store(SNAPSHOT_BUCKET)


async def log_created(js: JetStreamContext) -> str:
    """The creation time of SHOAL_EVENTS: which incarnation of the log a snapshot belongs to."""
    info = await js.stream_info(stream_name("events"))
    return str(info.created)


async def write_snapshot(js: JetStreamContext, state: State) -> int:
    """Store `state` as the snapshot; the seq it covers. Call only from the leading master."""
    data = encode_snapshot(state, await log_created(js))
    store = await js.object_store(SNAPSHOT_BUCKET)
    await store.put(SNAPSHOT_OBJECT, data)
    logger.debug("snapshot of seq {} written ({} bytes)", state.last_seq, len(data))
    return state.last_seq


async def read_snapshot(js: JetStreamContext) -> Snapshot | None:
    """The stored snapshot if this log can start from it; None (logged) otherwise."""
    try:
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            store = await js.object_store(SNAPSHOT_BUCKET)
            data = (await store.get(SNAPSHOT_OBJECT)).data or b""
            created = await log_created(js)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.ObjectNotFoundError):
        logger.info("no snapshot of the State stored: folding the log from its start")
        return None
    except (nats.errors.Error, TimeoutError) as exc:
        logger.warning("snapshot unreadable ({!r}): folding the log from its start", exc)
        return None
    try:
        snapshot = decode_snapshot(data)
    except UnusableSnapshot as exc:
        logger.warning("ignoring the stored snapshot: {}; folding the log from its start", exc)
        return None
    if snapshot.log_created != created:
        logger.warning("ignoring the stored snapshot: it was folded from an earlier SHOAL_EVENTS stream")
        return None
    return snapshot
