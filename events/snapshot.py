"""A State as bytes, to start a service from (`eventlog.snapshots` stores them in NATS).

A snapshot is the State folded up to `state.last_seq`, plus what tells whether it still fits the
log: its `format` (bumped whenever State's shape changes incompatibly) and `log_created`, the
creation time of the SHOAL_EVENTS stream it was folded from (a stream deleted and recreated
restarts its seqs, and a snapshot of the old one would silently stand in for the new one's head).
Decoding is total: anything unusable (another format, corruption, a shape this code cannot read)
is an `UnusableSnapshot` whose message says why, and the caller folds the log from its start.

The encoding is msgpack (compact, and it keeps the int keys of the per-rank maps); the persistent
maps travel as plain maps and come back as `immutables.Map`, so a decoded State is equal, and
`canonical_bytes`-identical, to the one encoded.
"""

from __future__ import annotations

import typing
from typing import Any

import immutables
import msgspec

from events.state import State

SNAPSHOT_FORMAT = 1


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    format: int = SNAPSHOT_FORMAT  # first, so a `_Header` reads it from any later shape
    log_created: str  # the SHOAL_EVENTS stream's creation time, as the server reports it
    state: State  # folded up to and including state.last_seq


class _Header(msgspec.Struct, kw_only=True):
    format: int


class UnusableSnapshot(Exception):
    """A stored snapshot this code cannot start from; the message says why."""


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, immutables.Map):
        return dict(obj.items())  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType, reportUnknownVariableType]
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _from_plain(kind: type, obj: Any) -> Any:
    if typing.get_origin(kind) is immutables.Map:
        key, value = typing.get_args(kind)
        return immutables.Map(msgspec.convert(obj, dict[key, value]))
    raise NotImplementedError(f"cannot decode {kind}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_to_plain)
_header = msgspec.msgpack.Decoder(_Header)
_decoder = msgspec.msgpack.Decoder(Snapshot, dec_hook=_from_plain)


def encode_snapshot(state: State, log_created: str) -> bytes:
    return _encoder.encode(Snapshot(log_created=log_created, state=state))


def decode_snapshot(data: bytes) -> Snapshot:
    """The snapshot in `data`, or `UnusableSnapshot` saying why it cannot be used."""
    try:
        found = _header.decode(data).format
    except msgspec.DecodeError as exc:
        raise UnusableSnapshot(f"not a snapshot ({exc})") from exc
    if found != SNAPSHOT_FORMAT:
        raise UnusableSnapshot(f"snapshot format {found}, this shoal reads format {SNAPSHOT_FORMAT}")
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:  # ValueError: a key a Map refused
        raise UnusableSnapshot(f"snapshot format {found} does not decode: {exc}") from exc
