"""nats-py's connection for the log (stream management, single appends, telemetry), opened from a
`NatsEndpoint` with the same TLS context and identity as the log's own wire connections.

Before nats-py connects, one wire connection (`wire.py`) waits for the server and completes the
handshake, TLS and nkey authentication included: nats-py (2.x) never returns from a first connect whose TLS handshake
failed, so a wrong CA or a missing client certificate would hang a service instead of naming the
setting to fix.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any

import nats
import nats.errors
from loguru import logger
from nats.aio.client import Client

from eventlog.endpoint import NatsEndpoint
from eventlog.identity import CredentialsUnreadable
from eventlog.publish import LogError
from eventlog.tls import TlsRefused, TlsSetupError
from eventlog.wire import Wire, WireClosed, WireError, split_servers

RETRY_SECONDS = 0.25
DRAIN_SECONDS = 5.0  # a closing connection waits this long for its subscriptions (nats-py: 30)
CLOSE_FLUSH_SECONDS = 2.0  # how long a closing connection waits for the server's answer before it drains


class Reconnects:
    """How many times a connection came back after losing its server, and a way to wait for the
    next time (a service re-announces itself then: the log may have moved on without it)."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Condition()

    async def note(self) -> None:
        async with self._changed:
            self.count += 1
            self._changed.notify_all()

    async def after(self, seen: int) -> int:
        """Wait until the connection has come back more than `seen` times; the new count."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.count > seen)
            return self.count


class RepeatedErrors:
    """Which errors to log while a connection retries a server that is gone (nats-py reports one
    per try, four a second): the first of each text, then once per `every_seconds` with how many
    were left out meanwhile. `clear()` once connected again."""

    def __init__(self, every_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_seconds = every_seconds
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}  # text -> (when last logged, left out since)

    def left_out_before(self, text: str) -> int | None:
        """None: leave this one out; else log it, saying how many like it were left out."""
        now = self._clock()
        logged_at, left_out = self._seen.get(text, (None, 0))
        if logged_at is not None and now - logged_at < self.every_seconds:
            self._seen[text] = (logged_at, left_out + 1)
            return None
        self._seen[text] = (now, 0)
        return left_out

    def clear(self) -> None:
        self._seen.clear()


class NatsClient:
    """nats-py's client, the TLS context every other connection of its owner reuses, whether
    the owner is closing (a disconnect then is expected, not news), and its reconnects."""

    def __init__(self, nc: Client, tls: ssl.SSLContext | None, closing: asyncio.Event, reconnects: Reconnects) -> None:
        self.nc = nc
        self.tls = tls
        self.closing = closing
        self.reconnects = reconnects

    async def close(self) -> None:
        """Close, drained when the server answers and at once when it is frozen or gone: a stop
        must not wait on it (nats-py's drain then waits its whole timeout and 10 s more for a
        flush, and cannot be cancelled). A server that answers the first flush and then stops
        (shut down at the same moment, as `shoal nats` and `shoal events tail` by one Ctrl-C)
        costs at most `DRAIN_SECONDS`."""
        self.closing.set()
        if self.nc.is_connected and await self._answers():
            await self._drain_within(DRAIN_SECONDS)
        if not self.nc.is_closed:
            try:
                await self.nc.close()
            except OSError as exc:  # the socket broke under it (ETIMEDOUT after a partition): closed all the same
                logger.debug("the NATS connection broke as it closed: {}", exc)

    async def _drain_within(self, seconds: float) -> None:
        """nats-py's drain, for `seconds` at most: its own timeout does not bound it (a flush of up
        to 10 s follows, and it ignores a cancel), so past them it is left to end by itself (its
        outcome read, never raised) and the connection is closed without it."""
        drain = asyncio.ensure_future(self.nc.drain())
        drain.add_done_callback(_outcome_read)  # also if this close is cancelled while it waits
        done, _ = await asyncio.wait({drain}, timeout=seconds)
        if drain not in done:
            logger.debug("drain on close did not end within {}s; closing without it", seconds)
            return  # it ends once the connection is closed, or after its own flush's 10 s
        failure = drain.exception()
        if isinstance(failure, nats.errors.Error | TimeoutError):
            logger.debug("drain on close failed ({!r}); closing", failure)
        elif failure is not None:
            raise failure

    async def _answers(self) -> bool:
        try:
            await self.nc.flush(timeout=CLOSE_FLUSH_SECONDS)  # pyright: ignore[reportArgumentType]
        except (nats.errors.Error, TimeoutError) as exc:
            logger.debug("the server did not answer a flush on close ({!r}); closing without a drain", exc)
            return False
        return True

    @classmethod
    async def open(cls, endpoint: NatsEndpoint, *, name: str, wait_seconds: float) -> NatsClient:
        """Connect, waiting up to `wait_seconds` for a server; reconnect forever once connected.

        Every error a user can cause is a `LogError` that says what to do: a URL the log cannot
        speak, a TLS file that cannot be used, a handshake the server refuses, no server at all.
        """
        url = endpoint.url
        try:
            split_servers(url)  # the bulk paths speak the protocol themselves: refuse what they cannot
            tls = endpoint.tls_context()
        except (ValueError, TlsSetupError) as exc:
            raise LogError(str(exc)) from exc
        await _reach(endpoint, tls, wait_seconds)
        closing = asyncio.Event()
        connected = asyncio.Event()
        reconnects = Reconnects()
        try:
            nc = await nats.connect(  # pyright: ignore[reportUnknownMemberType]
                url.split(","),
                name=name,
                max_reconnect_attempts=max(1, round(wait_seconds / RETRY_SECONDS)),
                reconnect_time_wait=RETRY_SECONDS,
                connect_timeout=2,
                drain_timeout=DRAIN_SECONDS,  # pyright: ignore[reportArgumentType]
                allow_reconnect=True,
                **endpoint.nats_py_kwargs(tls),
                **_callbacks(url, connected, closing, reconnects),
            )
        except (OSError, nats.errors.Error, TimeoutError) as exc:
            raise LogError(_unreachable(endpoint, exc)) from exc
        nc.options["max_reconnect_attempts"] = -1  # bounded only for the first connect
        connected.set()
        return cls(nc, tls, closing, reconnects)


async def _reach(endpoint: NatsEndpoint, tls: ssl.SSLContext | None, wait_seconds: float) -> None:
    """Wait until a server of the endpoint completes a handshake with us, TLS and identity
    included (see the module docstring)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            wire = await Wire.open(endpoint.url, tls=tls, identity=endpoint.identity, timeout=2.0, name="shoal-probe")
        except (TlsRefused, CredentialsUnreadable) as exc:
            raise LogError(str(exc)) from exc
        except WireClosed as exc:
            if _refused_identity(exc) or time.monotonic() >= deadline:
                raise LogError(_unreachable(endpoint, exc)) from exc
            await asyncio.sleep(RETRY_SECONDS)
        else:
            wire.close()
            return


def _refused_identity(exc: WireClosed) -> bool:
    """The server answered and refused who we are (no identity, or one it does not admit): asking
    again cannot help, and waiting would hide the reason behind a timeout."""
    reason = str(exc).lower()  # not "authentication timeout": a slow handshake may pass next time
    return isinstance(exc.__cause__, WireError) and (
        "authorization violation" in reason or "user authentication" in reason
    )


def _unreachable(endpoint: NatsEndpoint, exc: Exception) -> str:
    identity = "admit this identity" if endpoint.identity.nkey_seed_file else "need an identity"
    return (
        f"cannot connect to NATS at {endpoint.url}: {exc}; is the server running (`shoal nats`), "
        f"and does it {identity} (nats_credentials_dir)?"
    )


def _callbacks(url: str, connected: asyncio.Event, closing: asyncio.Event, reconnects: Reconnects) -> dict[str, Any]:
    """nats-py callbacks that log through loguru; quiet before the first connect and after close()."""

    repeats = RepeatedErrors()

    async def on_error(exc: Exception) -> None:
        if connected.is_set() and (left_out := repeats.left_out_before(str(exc))) is not None:
            more = f" ({left_out} more like it in the last {repeats.every_seconds:g}s)" if left_out else ""
            logger.warning("NATS connection {}: {}{}", url, exc, more)

    async def on_disconnect() -> None:
        if connected.is_set() and not closing.is_set():
            logger.warning("NATS disconnected from {}; reconnecting", url)

    async def on_reconnect() -> None:
        repeats.clear()
        logger.info("NATS reconnected to {}", url)
        await reconnects.note()

    return {"error_cb": on_error, "disconnected_cb": on_disconnect, "reconnected_cb": on_reconnect}


def _outcome_read(task: asyncio.Future[None]) -> None:
    """A task left to end by itself: its exception is read, so asyncio does not report it."""
    if not task.cancelled():
        task.exception()
