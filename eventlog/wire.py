"""A minimal NATS protocol connection for the log's bulk paths (replay, follow, append_many).

Why not nats-py here: its per-message path (a `Msg` object, header parsing through the email
parser, an asyncio queue hop) caps a replay near 50k msgs/s on a small machine; this reader
parses whole socket reads in one loop and keeps replay + fold above 100k/s. nats-py remains the
client for everything else (stream management, single appends, telemetry).

The connection has no background task: whoever calls `read_batch()` drives it, answering server
PINGs as it goes. One owner at a time. It speaks plain `nats://` (optionally `user:pass@` or a
token in the URL); for TLS or credential files use nats-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from urllib.parse import urlsplit

_CRLF = b"\r\n"
READ_SIZE = 1 << 20


class WireError(ConnectionError):
    """The server reported a protocol error (-ERR) or answered unexpectedly."""


class WireClosed(ConnectionError):
    """The connection ended (server stopped, network gone)."""


# (sid, subject, reply, headers, payload); headers is the raw "NATS/1.0 ..." block, b"" when none
WireMessage = tuple[int, bytes, bytes, bytes, bytes]


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

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._out = bytearray()
        self._in = b""
        self._next_sid = 0
        self._pongs = 0

    @classmethod
    async def open(cls, url: str, *, timeout: float = 5.0, name: str = "shoal-wire") -> Wire:
        last: Exception | None = None
        for host, port, auth in split_servers(url):
            try:
                return await asyncio.wait_for(cls._handshake(host, port, auth, name), timeout)
            except (OSError, TimeoutError, WireError) as exc:
                last = exc
        raise WireClosed(f"cannot connect to NATS at {url}: {last}") from last

    @classmethod
    async def _handshake(cls, host: str, port: int, auth: dict[str, str], name: str) -> Wire:
        reader, writer = await asyncio.open_connection(host, port, limit=READ_SIZE * 4)
        info = await reader.readline()
        if not info.startswith(b"INFO "):
            writer.close()
            raise WireError(f"{host}:{port} did not greet like a NATS server: {info[:80]!r}")
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
        }
        wire = cls(reader, writer)
        writer.write(b"CONNECT " + json.dumps(connect).encode() + _CRLF)
        await wire.roundtrip()
        return wire

    def new_inbox(self) -> str:
        return f"_INBOX.shoal.{secrets.token_hex(8)}"

    def subscribe(self, subject: str) -> int:
        self._next_sid += 1
        self._out += f"SUB {subject} {self._next_sid}\r\n".encode()
        return self._next_sid

    def unsubscribe(self, sid: int) -> None:
        self._out += f"UNSUB {sid}\r\n".encode()

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

    async def roundtrip(self) -> list[WireMessage]:
        """PING and read until its PONG: everything sent before is processed by the server.

        Returns the messages that arrived meanwhile (the caller must not drop them).
        """
        self._out += b"PING\r\n"
        await self.flush()
        want = self._pongs + 1
        got: list[WireMessage] = []
        while self._pongs < want:
            got.extend(await self.read_batch())
        return got

    async def read_batch(self) -> list[WireMessage]:
        """Wait for data and return every complete message in it (possibly none)."""
        buf = await self.read_data()
        messages: list[WireMessage] = []
        pos = 0
        while True:
            message, end = self.parse_frame(buf, pos)
            if end < 0:
                break
            if message is not None:
                messages.append(message)
            pos = end
        self.unread(buf[pos:])
        return messages

    async def read_data(self) -> bytes:
        """Send what is queued (PONGs, flow-control replies), then wait for bytes.

        Returns the unparsed bytes kept from before followed by the new ones; the caller parses
        what it can and hands the incomplete tail back with `unread()`.
        """
        if self._out:
            await self.flush()
        try:
            data = await self._reader.read(READ_SIZE)
        except OSError as exc:
            raise WireClosed(str(exc)) from exc
        if not data:
            raise WireClosed("connection closed by the server")
        buf = self._in + data if self._in else data
        self._in = b""
        return buf

    def unread(self, rest: bytes) -> None:
        self._in = rest

    def parse_frame(self, buf: bytes, pos: int) -> tuple[WireMessage | None, int]:
        """One frame at `pos`: (message or None for control lines, position after it), or (None, -1)
        when the frame is incomplete. Control lines (PING, PONG, -ERR, INFO, +OK) are handled here."""
        eol = buf.find(_CRLF, pos)
        if eol < 0:
            return None, -1
        op = buf[pos : pos + 4]
        if op != b"HMSG" and op != b"MSG ":
            self._control(buf[pos:eol])
            return None, eol + 2
        parts = buf[pos:eol].split(b" ")
        if op == b"HMSG":
            reply = parts[3] if len(parts) == 6 else b""
            hlen, tlen = int(parts[-2]), int(parts[-1])
        else:
            reply = parts[3] if len(parts) == 5 else b""
            hlen, tlen = 0, int(parts[-1])
        start = eol + 2
        end = start + tlen
        if end + 2 > len(buf):
            return None, -1  # incomplete payload: wait for more bytes
        return (int(parts[2]), parts[1], reply, buf[start : start + hlen], buf[start + hlen : end]), end + 2

    def _control(self, line: bytes) -> None:
        if line == b"PING":
            self._out += b"PONG\r\n"
        elif line == b"PONG":
            self._pongs += 1
        elif line.startswith(b"-ERR"):
            raise WireError(f"NATS server error: {line[5:].decode(errors='replace').strip()}")
        # INFO (cluster updates) and +OK need no answer

    def close(self) -> None:
        """Send what is queued (best effort, without waiting) and close."""
        with contextlib.suppress(Exception):
            if self._out:
                self._writer.write(self._out)
                self._out = bytearray()
            self._writer.close()


async def request(
    wire: Wire, subject: str, payload: bytes, *, timeout: float = 5.0, others: list[WireMessage] | None = None
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
                for message in await wire.read_batch():  # keep the whole batch: more may follow the reply
                    if message[0] != sid:
                        if others is not None:
                            others.append(message)
                    elif message[3].startswith(b"NATS/1.0 503"):
                        raise WireError(f"no responders on {subject} (is JetStream enabled?)")
                    else:
                        reply = message[4]
            return reply
    finally:
        wire.unsubscribe(sid)
