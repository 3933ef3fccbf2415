"""The NATS client protocol as the server speaks it, parsed without I/O: bytes in, typed frames out.

`FrameParser.feed(data)` takes whatever a socket read returned and gives back every complete
frame in it (`Msg`, `Ping`, `Pong`, `Ok`, `Err`, `Info`), keeping an incomplete tail for the next
call. It is the only parser of server frames in shoal: the log's replay, follow, append acks and
request/reply all read through it (via `eventlog.wire.Wire`), so a framing rule is written once.

Invariants:
- Frames come out in the order the server sent them, each exactly once, however the bytes are
  split across calls.
- Bytes that are not the protocol raise `FrameError` (never an IndexError/ValueError); after
  one, the stream is out of step and the connection must be dropped.
- The parser never holds more than `max_line + max_payload + 4` bytes: a frame that claims a
  larger payload, or a line that runs on past `max_line` without CRLF, is a `FrameError` at once.

Speed matters here: a replay is one `feed` per 1 MiB socket read, so the loop parses a message
line with one split and two ints (the sid stays bytes), and builds one small `msgspec.Struct`
per message; control lines, rare, take the slower `_control`.
"""

from __future__ import annotations

import msgspec

MAX_PAYLOAD = 64 << 20  # nats-server refuses a max_payload above 64 MiB: no honest frame is larger
MAX_CONTROL_LINE = 64 << 10  # the longest protocol line accepted (nats-server sends < 4 KiB ones)
_CRLF = b"\r\n"
_STATUS_LINE = b"NATS/1.0 "


class FrameError(ConnectionError):
    """The bytes from the server are not a NATS protocol frame; the connection is out of step."""


class Msg(msgspec.Struct, frozen=True, gc=False):
    """A delivered message (`MSG`, or `HMSG` when `headers` is not empty), its fields as sent.

    `headers` is the raw header block ("NATS/1.0[ status text]\\r\\nKey: value\\r\\n...\\r\\n\\r\\n").
    `sid` stays the bytes token that `Wire.subscribe` returned: readers only compare it, and
    not converting it to an int is worth ~3% of a replay.
    """

    subject: bytes
    sid: bytes
    reply: bytes
    headers: bytes
    payload: bytes

    @property
    def status(self) -> int | None:
        """The status code of the header block (`NATS/1.0 100 Idle Heartbeat` -> 100), or None."""
        if not self.headers.startswith(_STATUS_LINE):
            return None
        code = self.headers[9:12]
        return int(code) if len(code) == 3 and code.isdigit() else None

    def header(self, name: bytes) -> bytes | None:
        """The value of header `name` (case-insensitive), or None when absent."""
        wanted = name.lower()
        for line in self.headers.split(_CRLF)[1:]:
            key, colon, value = line.partition(b":")
            if colon and key.strip().lower() == wanted:
                return value.strip()
        return None


class Ping(msgspec.Struct, frozen=True):
    """The server checks we are alive: answer PONG."""


class Pong(msgspec.Struct, frozen=True):
    """The answer to our PING: everything sent before it was processed."""


class Ok(msgspec.Struct, frozen=True):
    """`+OK` (sent only to verbose clients)."""


class Err(msgspec.Struct, frozen=True):
    """`-ERR '<text>'`: the server refuses something; most errors close the connection."""

    text: str


class Info(msgspec.Struct, frozen=True):
    """`INFO {json}`: the server's greeting, or a cluster update later; `body` is the raw JSON."""

    body: bytes


Frame = Msg | Ping | Pong | Ok | Err | Info
_PING, _PONG, _OK = Ping(), Pong(), Ok()


class FrameParser:
    """Incremental parser of the server's side of one NATS connection (see the module docstring)."""

    __slots__ = ("_tail", "max_line", "max_payload")

    def __init__(self, max_payload: int = MAX_PAYLOAD, max_line: int = MAX_CONTROL_LINE) -> None:
        self.max_payload = max_payload
        self.max_line = max_line
        self._tail = b""

    @property
    def buffered(self) -> int:
        """Bytes held back: the start of a frame whose end has not arrived yet."""
        return len(self._tail)

    def feed(self, data: bytes) -> list[Frame]:
        """Every frame completed by `data`, in order; the incomplete rest is kept for the next call.

        One loop with the message line parsed inline: a helper call per message would cost the
        replay a few percent."""
        buf = self._tail + data if self._tail else data
        frames: list[Frame] = []
        append, find = frames.append, buf.find
        pos, size, limit, max_line = 0, len(buf), self.max_payload, self.max_line
        while True:
            eol = find(_CRLF, pos)
            if eol < 0:
                if size - pos > max_line:
                    raise FrameError(f"no end of line in {size - pos} bytes: {buf[pos : pos + 60]!r}...")
                break
            # [H]MSG <subject> <sid> [reply] [<header size>] <total size>: the hot path, parsed inline
            fields = buf[pos:eol].split(b" ")
            op, count = fields[0], len(fields)
            try:
                if count == 6 and op == b"HMSG":  # a JetStream delivery
                    _, subject, sid, reply, hlen, tlen = fields
                    hlen, tlen = int(hlen), int(tlen)
                elif count == 4 and op == b"MSG":  # e.g. a publish acknowledgement
                    _, subject, sid, tlen = fields
                    reply, hlen, tlen = b"", 0, int(tlen)
                elif count == 5 and op == b"HMSG":
                    _, subject, sid, hlen, tlen = fields
                    reply, hlen, tlen = b"", int(hlen), int(tlen)
                elif count == 5 and op == b"MSG":
                    _, subject, sid, reply, tlen = fields
                    hlen, tlen = 0, int(tlen)
                else:
                    append(_control(buf[pos:eol]))
                    pos = eol + 2
                    continue
            except ValueError as exc:
                raise FrameError(f"bad message line ({exc}): {buf[pos : min(eol, pos + 120)]!r}") from None
            if not 0 <= hlen <= tlen <= limit:
                raise FrameError(f"sizes beyond 0 <= headers <= total <= {limit}: {buf[pos : min(eol, pos + 120)]!r}")
            start = eol + 2
            end = start + tlen
            if end + 2 > size:  # incomplete payload: the rest comes with a later read
                if eol - pos > max_line:
                    raise FrameError(f"message line of {eol - pos} bytes: {buf[pos : pos + 60]!r}...")
                break
            if buf[end] != 13 or buf[end + 1] != 10:  # CR LF (indexing is cheaper than a method call)
                raise FrameError(f"payload of {buf[pos:eol]!r} does not end where its size says")
            append(Msg(subject, sid, reply, buf[start : start + hlen], buf[start + hlen : end]))
            pos = end + 2
        self._tail = buf[pos:]
        return frames


def _control(line: bytes) -> Frame:
    if line == b"PING":
        return _PING
    if line == b"PONG":
        return _PONG
    if line == b"+OK":
        return _OK
    if line.startswith(b"-ERR"):
        return Err(line[4:].strip().strip(b"'").decode(errors="replace"))
    if line.startswith(b"INFO "):
        return Info(line[5:].strip())
    if line.startswith((b"MSG ", b"HMSG ")):
        raise FrameError(f"bad message line (wrong number of fields): {line[:120]!r}")
    raise FrameError(f"unknown protocol line: {line[:120]!r}")
