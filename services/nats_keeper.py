"""Keep `shoal up`'s embedded nats-server serving: start it again when it exits, restart it when
its store, out of disk space, has room again."""

from __future__ import annotations

import asyncio
import time

from loguru import logger

from services.nats import EmbeddedNats

KEEP_RUNNING_POLL_SECONDS = 0.5
STORE_ROOM_BYTES = 64 << 20  # free space a full store waits for before its server is restarted


async def keep_running(
    server: EmbeddedNats, poll_seconds: float = KEEP_RUNNING_POLL_SECONDS, room_bytes: int = STORE_ROOM_BYTES
) -> None:
    """Start `server` again each time it exits by itself (killed, crashed, out of memory), on the
    same port with the same store and identities, so every client's reconnect finds it and the log
    continues where it was. Runs until cancelled; a restart that fails raises (`NatsError`), for
    the caller's supervisor to retry with backoff (`shoal up` runs it as a service).

    A store that ran out of disk space stops the server acknowledging anything (appends wait, then
    fail with a 503 at the API; runners keep their backlog) and it would not write again by itself:
    once `room_bytes` are free again, the server is restarted, and the cluster resumes."""
    full_since: float | None = None
    while True:
        if server.running and server.store_full():
            if full_since is None:
                full_since = time.monotonic()
                logger.error(
                    "the NATS store {} is out of disk space: nothing more is acknowledged, so requests get 503; "
                    "free space on its disk: the server restarts by itself once {} MiB are free",
                    server.store_dir,
                    room_bytes >> 20,
                )
            if server.store_has_room(room_bytes):
                logger.warning("space is back for the NATS store {}: restarting its server", server.store_dir)
                await asyncio.to_thread(server.restart)
                full_for = time.monotonic() - full_since
                logger.info("the embedded nats-server writes again at {} ({:.0f}s full)", server.url, full_for)
                full_since = None
        if not server.running:
            code = server.exit_code()
            ended = "did not start again" if code is None else f"exited (code {code})"
            logger.warning(
                "the embedded nats-server {}; starting it again at {} (its log: {})",
                ended,
                server.url,
                server.last_log_lines(),
            )
            # the loop's default executor: `asyncio.run` waits for a start in flight before it
            # returns, so the owner's `stop()` after it cannot miss the server being started
            await asyncio.to_thread(server.start)
            logger.info("the embedded nats-server is back at {}; services reconnect to it", server.url)
        await asyncio.sleep(poll_seconds)
