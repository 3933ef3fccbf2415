"""A minimal NATS protocol connection for the log's bulk paths (replay, follow, append_many).

Why not nats-py here: its per-message path (a `Msg` object, header parsing through the email
parser, an asyncio queue hop) caps a replay near 50k msgs/s on a small machine; this reader
parses whole socket reads in one loop and keeps replay + fold above 100k/s. nats-py remains the
client for everything else (stream management, single appends, telemetry).

Frames are parsed by `eventlog.frames.FrameParser`, the one parser of server frames.
The connection has no background task: whoever calls `read_messages()` drives it, answering server
PINGs as it goes. One owner at a time. It speaks plain `nats://` (optionally `user:pass@` or a
token in the URL) and authenticates like nats-py, from the same `ConnectOptions` (an nkey signs the
server's nonce).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from urllib.parse import urlsplit

import msgspec

from eventlog.connect_options import ANONYMOUS, ConnectOptions
from eventlog.frames import Err, Frame, FrameError, FrameParser, Info, Msg, Ping, Pong

_CRLF = b"\r\n"
READ_SIZE = 1 << 20


class _ServerInfo(msgspec.Struct, frozen=True):
    """What the handshake needs from the server's INFO: the nonce an nkey must sign, if any."""

    nonce: str | None = None


_server_info = msgspec.json.Decoder(_ServerInfo)


class WireError(ConnectionError):
    """The server reported a protocol error (-ERR) or answered unexpectedly."""


class WireClosed(ConnectionError):
    """The connection ended (server stopped, network gone)."""


def split_servers(url: str) -> list[tuple[str, int, dict[str, str]]]:
    """`nats://a:4222,nats://b:4223` -> [(host, port, auth fields for CONNECT)]."""
    servers: list[tuple[str, int, dict[str, str]]] = []
    for part in url.split(","):
        part = part.strip()
        if not part:
            continue
        parsed = urlsplit(part if "://" in part else f"nats://{part}")
        if parsed.scheme not in ("nats", "tcp"):
            raise ValueError(f"unsupported NATS URL scheme {parsed.scheme!r} in {part!r}: use nats://host:port")
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
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, options: ConnectOptions = ANONYMOUS
    ) -> None:
        self._options = options
        self._reader = reader
        self._writer = writer
        self._out = bytearray()
        self._parser = FrameParser()
        self._next_sid = 0
        self._pongs = 0

    @classmethod
    async def open(
        cls, url: str, *, timeout: float = 5.0, name: str = "shoal-wire", options: ConnectOptions = ANONYMOUS
    ) -> Wire:
        last: Exception | None = None
        for host, port, auth in split_servers(url):
            try:
                return await asyncio.wait_for(cls._handshake(host, port, auth, name, options), timeout)
            except (OSError, TimeoutError, WireError) as exc:
                last = exc
        raise WireClosed(f"cannot connect to NATS at {url}: {last}") from last

    @classmethod
    async def _handshake(cls, host: str, port: int, auth: dict[str, str], name: str, options: ConnectOptions) -> Wire:
        reader, writer = await asyncio.open_connection(host, port, limit=READ_SIZE * 4)
        wire = cls(reader, writer, options)
        try:
            info = await wire._greeting(f"{host}:{port}")
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
                **options.connect_fields(info.nonce),
            }
            writer.write(b"CONNECT " + json.dumps(connect).encode() + _CRLF)
            await wire.roundtrip()
        except BaseException:  # a timeout cancels us here too: do not leave the socket open
            wire.close()
            raise
        return wire

    async def _greeting(self, where: str) -> _ServerInfo:
        """Read up to the server's first frame, which must be INFO; what it says."""
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
            return _server_info.decode(first.body)
        except msgspec.DecodeError as exc:
            raise WireError(f"{where} sent an INFO that is not a JSON object: {exc}") from exc

    def new_inbox(self) -> str:
        """A fresh subject under this client's inbox prefix (the only place it may subscribe)."""
        return f"{self._options.inbox_prefix}.{secrets.token_hex(8)}"

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
                raise WireError(f"NATS server error: {frame.text}")
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
