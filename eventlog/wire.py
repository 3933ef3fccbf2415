"""A minimal NATS protocol connection for the log's bulk paths (replay, follow, append_many).

Why not nats-py here: its per-message path (a `Msg` object, header parsing through the email
parser, an asyncio queue hop) caps a replay near 50k msgs/s on a small machine; this reader
parses whole socket reads in one loop and keeps replay + fold above 100k/s. nats-py remains the
client for everything else (stream management, single appends, telemetry).

Frames are parsed by `eventlog.frames.FrameParser`, the one parser of server frames.
The connection has no background task: whoever calls `read_messages()` drives it, answering server
PINGs as it goes. One owner at a time. It speaks `nats://` and `tls://` (optionally `user:pass@`
or a token in the URL) and authenticates like nats-py, from the same `NatsIdentity` (an nkey signs
the server's nonce). TLS is the standard upgrade (`eventlog/tls.py`): the server's INFO comes in
plain text, then the same socket is wrapped once INFO says `tls_required`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import ssl
from urllib.parse import urlsplit

import msgspec

from eventlog.frames import Err, Frame, FrameError, FrameParser, Info, Msg, Ping, Pong
from eventlog.identity import ANONYMOUS, CredentialsUnreadable, NatsIdentity
from eventlog.tls import TlsRefused, explain_refusal, setting

_CRLF = b"\r\n"
READ_SIZE = 1 << 20


class WireError(ConnectionError):
    """The server reported a protocol error (-ERR) or answered unexpectedly."""


class PermissionRefused(WireError):
    """The server refused a publish or subscription to this identity (`Permissions Violation`):
    retrying cannot help, the identity may not do it (README "Security")."""


class WireClosed(ConnectionError):
    """The connection ended (server stopped, network gone)."""


class Greeting(msgspec.Struct, frozen=True):
    """The fields of the server's first INFO that the handshake acts on: whether to upgrade to
    TLS, and the nonce an nkey must sign, if any."""

    tls_required: bool = False
    nonce: str | None = None


_greeting_decoder = msgspec.json.Decoder(Greeting)


def split_servers(url: str) -> list[tuple[str, int, dict[str, str]]]:
    """`nats://a:4222,nats://b:4223` -> [(host, port, auth fields for CONNECT)]."""
    servers: list[tuple[str, int, dict[str, str]]] = []
    for part in url.split(","):
        part = part.strip()
        if not part:
            continue
        parsed = urlsplit(part if "://" in part else f"nats://{part}")
        if parsed.scheme not in ("nats", "tcp", "tls"):
            raise ValueError(
                f"unsupported NATS URL scheme {parsed.scheme!r} in {part!r}: use nats://host:port or tls://host:port"
            )
        auth: dict[str, str] = {}
        if parsed.username and parsed.password is not None:
            auth = {"user": parsed.username, "pass": parsed.password}
        elif parsed.username:
            auth = {"auth_token": parsed.username}
        servers.append((parsed.hostname or "127.0.0.1", parsed.port or 4222, auth))
    if not servers:
        raise ValueError(f"no server in NATS URL {url!r}")
    return servers


class Wire:
    """One TCP connection speaking the NATS client protocol (subset: SUB/UNSUB/PUB/HPUB/PING)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, identity: NatsIdentity = ANONYMOUS
    ) -> None:
        self._identity = identity
        self._reader = reader
        self._writer = writer
        self._out = bytearray()
        self._parser = FrameParser()
        self._next_sid = 0
        self._pongs = 0

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        tls: ssl.SSLContext | None = None,
        identity: NatsIdentity = ANONYMOUS,
        timeout: float = 5.0,
        name: str = "shoal-wire",
    ) -> Wire:
        """Connect to the first server of `url` that answers, as `identity`.

        `tls` given: TLS is required (a server that does not offer it is refused, never used in
        plain text). None: plain, unless the server requires TLS; then the system's default
        context verifies it, as nats-py does. A TLS failure a setting fixes is `TlsRefused`; a
        seed file that cannot be used is `CredentialsUnreadable` (neither is worth retrying).
        """
        last: Exception | None = None
        for host, port, auth in split_servers(url):
            try:
                # Not `asyncio.wait_for`: on Python 3.11 it swallows a cancel that arrives as the
                # handshake completes, and a cancelled follow() then reads on forever (the hang
                # of a master stopped right after its start, tests/security/test_poison.py).
                async with asyncio.timeout(timeout):
                    return await cls._handshake(host, port, auth, name, tls, identity)
            except CredentialsUnreadable:
                raise
            except (OSError, TimeoutError, WireError) as exc:
                last = exc
        raise WireClosed(f"cannot connect to NATS at {url}: {last}") from last

    @classmethod
    async def _handshake(
        cls, host: str, port: int, auth: dict[str, str], name: str, tls: ssl.SSLContext | None, identity: NatsIdentity
    ) -> Wire:
        reader, writer = await asyncio.open_connection(host, port, limit=READ_SIZE * 4)
        wire = cls(reader, writer, identity)
        where = f"{host}:{port}"
        upgraded = False
        try:
            greeting = await wire._greeting(where)
            if tls is not None or greeting.tls_required:
                await wire._upgrade(tls or ssl.create_default_context(), host, where, greeting.tls_required)
                upgraded = True
            connect = {
                "verbose": False,
                "pedantic": False,
                "headers": True,
                "no_responders": True,
                "protocol": 1,
                "lang": "python-shoal",
                "version": "0",
                "name": name,
                **auth,
                **identity.connect_fields(greeting.nonce),
            }
            # CONNECT and PING in one write: a server that refuses our certificate after the handshake
            # (TLS 1.3) has closed the socket by now, and a second write would fail before its alert is read
            wire.send_raw(b"CONNECT " + json.dumps(connect).encode() + _CRLF)
            await wire.roundtrip()
        except WireClosed as exc:
            alert = await wire._tls_alert(exc) if upgraded else None
            wire.close()
            if alert is not None:
                raise explain_refusal(alert, where) from exc
            if upgraded:  # the alert was lost to the race: say what usually causes it (retried, then reported)
                raise WireClosed(
                    f"{where} ended the connection right after the TLS handshake ({exc}); a server "
                    "that verifies clients does so to a client without an acceptable certificate: "
                    f"{setting('cert')} and {setting('key')}"
                ) from exc
            raise
        except BaseException:  # a timeout cancels us here too: do not leave the socket open
            wire.close()
            raise
        return wire

    async def _upgrade(self, context: ssl.SSLContext, host: str, where: str, offered: bool) -> None:
        """Wrap the socket in TLS (the server waits for the handshake right after its INFO)."""
        if not offered:
            raise TlsRefused(
                f"the NATS server at {where} does not offer TLS, but a tls:// URL or a nats_tls_* setting "
                "asks for it: enable TLS on the server, or connect with nats:// and no nats_tls_* setting"
            )
        try:
            await self._writer.start_tls(context, server_hostname=host)
        except ssl.SSLError as exc:
            raise explain_refusal(exc, where) from exc

    async def _tls_alert(self, closed: WireClosed) -> ssl.SSLError | None:
        """The TLS alert that ended a just-upgraded connection, if any. A TLS 1.3 server refuses a
        client certificate after the client's side of the handshake is done: the alert arrives
        with our first read, or is still unread when our first write has already failed."""
        if isinstance(closed.__cause__, ssl.SSLError):
            return closed.__cause__
        try:
            async with asyncio.timeout(1.0):
                await self._reader.read(1)
        except ssl.SSLError as alert:
            return alert
        except (OSError, TimeoutError):
            pass
        return None

    async def _greeting(self, where: str) -> Greeting:
        """Read up to the server's first frame, which must be INFO; the fields the handshake needs."""
        frames: list[Frame] = []
        try:
            while not frames:
                frames = self._parser.feed(await self._receive())
        except FrameError as exc:
            raise WireError(f"{where} did not greet like a NATS server: {exc}") from exc
        first = frames[0]
        if isinstance(first, Err):
            raise WireError(f"{where} refused the connection: {first.text}")
        if not isinstance(first, Info):
            raise WireError(f"{where} did not greet like a NATS server: {first!r}")
        self._answer(frames[1:])  # nothing is subscribed yet: control frames only
        try:
            return _greeting_decoder.decode(first.body)
        except msgspec.DecodeError as exc:
            raise WireError(f"{where} sent an INFO that is not NATS's: {exc}") from exc

    def new_inbox(self) -> str:
        """A fresh subject under this client's inbox prefix (the only place it may subscribe)."""
        return f"{self._identity.inbox_prefix}.{secrets.token_hex(8)}"

    def subscribe(self, subject: str) -> bytes:
        """Subscribe; returns the subscription id, the token `Msg.sid` carries (bytes, as sent)."""
        self._next_sid += 1
        sid = str(self._next_sid).encode()
        self._out += b"SUB %s %s\r\n" % (subject.encode(), sid)
        return sid

    def unsubscribe(self, sid: bytes) -> None:
        self._out += b"UNSUB %s\r\n" % sid

    def publish(self, subject: bytes, payload: bytes, reply: bytes = b"", headers: bytes = b"") -> None:
        """Queue one message; `flush()` sends the queue. `headers` is a full "NATS/1.0\\r\\n...\\r\\n\\r\\n" block."""
        out = self._out
        if headers:
            total = len(headers) + len(payload)
            out += (
                b"HPUB %s %s %d %d\r\n" % (subject, reply, len(headers), total)
                if reply
                else (b"HPUB %s %d %d\r\n" % (subject, len(headers), total))
            )
            out += headers
        else:
            out += (
                b"PUB %s %s %d\r\n" % (subject, reply, len(payload))
                if reply
                else (b"PUB %s %d\r\n" % (subject, len(payload)))
            )
        out += payload
        out += _CRLF

    def send_raw(self, frames: bytes) -> None:
        """Queue ready-made protocol frames (e.g. many HPUBs joined); `flush()` sends them."""
        self._out += frames

    async def flush(self) -> None:
        if not self._out:
            return
        self._writer.write(self._out)
        self._out = bytearray()
        try:
            await self._writer.drain()
        except OSError as exc:
            raise WireClosed(str(exc)) from exc

    async def roundtrip(self) -> list[Msg]:
        """PING and read until its PONG: everything sent before is processed by the server.

        Returns the messages that arrived meanwhile (the caller must not drop them).
        """
        self._out += b"PING\r\n"
        await self.flush()
        want = self._pongs + 1
        got: list[Msg] = []
        while self._pongs < want:
            got.extend(await self.read_messages())
        return got

    async def read_messages(self) -> list[Msg]:
        """Send what is queued (PONGs, flow-control replies), wait for bytes, and return every
        message they complete (possibly none). Control frames are handled on the way."""
        if self._out:
            await self.flush()
        frames = self._parser.feed(await self._receive())
        messages = [frame for frame in frames if type(frame) is Msg]
        if len(messages) < len(frames):
            self._answer(frames)
        return messages

    async def _receive(self) -> bytes:
        """One socket read."""
        try:
            data = await self._reader.read(READ_SIZE)
        except OSError as exc:
            raise WireClosed(str(exc)) from exc
        if not data:
            raise WireClosed("connection closed by the server")
        return data

    def _answer(self, frames: list[Frame]) -> None:
        """Act on the control frames among `frames`: PING is answered, PONG counted, -ERR raised."""
        for frame in frames:
            if type(frame) is Ping:
                self._out += b"PONG\r\n"
            elif type(frame) is Pong:
                self._pongs += 1
            elif type(frame) is Err:
                refused = "Permissions Violation" in frame.text
                raise (PermissionRefused if refused else WireError)(f"NATS server error: {frame.text}")
            # INFO (cluster updates) and +OK need no answer

    def close(self) -> None:
        """Send what is queued (best effort, without waiting) and close."""
        with contextlib.suppress(Exception):
            if self._out:
                self._writer.write(self._out)
                self._out = bytearray()
            self._writer.close()


async def request(
    wire: Wire, subject: str, payload: bytes, *, timeout: float = 5.0, others: list[Msg] | None = None
) -> bytes:
    """A request/reply over `wire`; returns the reply payload.

    Messages for other subscriptions that arrive meanwhile go to `others` (dropped when None).
    """
    inbox = wire.new_inbox()
    sid = wire.subscribe(inbox)
    wire.publish(subject.encode(), payload, inbox.encode())
    await wire.flush()
    try:
        async with asyncio.timeout(timeout):
            reply: bytes | None = None
            while reply is None:
                for message in await wire.read_messages():  # keep them all: more may follow the reply
                    if message.sid != sid:
                        if others is not None:
                            others.append(message)
                    elif message.status == 503:
                        raise WireError(f"no responders on {subject} (is JetStream enabled?)")
                    else:
                        reply = message.payload
            return reply
    finally:
        wire.unsubscribe(sid)
