"""Distinct id types and their validation.

Ids appear as NATS subject tokens (`shoal.ev.task.<task_id>.<kind>`), so they must not contain
the characters NATS gives meaning to. They are checked twice: on the command line
(`check_token`) and by the decoder of every event (the `*Field` aliases below), so an event
carrying an id that is not a token is a `MalformedEvent` at the edge and can never make a
service build an invalid subject.
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated, NewType

import msgspec

TaskId = NewType("TaskId", str)
NodeId = NewType("NodeId", str)
InstanceId = NewType("InstanceId", str)
EventId = NewType("EventId", str)
KeyId = NewType("KeyId", str)  # names an API key without revealing it (a prefix of its SHA-256)

MAX_ID_LENGTH = 128
# `(?!\n)`: Python's `$` also matches before a final newline, which must not pass; the pattern
# stays valid ECMA-262 (JSON Schema), where `$` alone already means the end.
ID_PATTERN = r"^[A-Za-z0-9_\-]{1,128}$(?!\n)"
_TOKEN = re.compile(ID_PATTERN)
_ID_RULE = "1-128 characters from A-Z a-z 0-9 _ - (a NATS subject token)"

# The same types as struct fields, where the msgspec decoder enforces the rule. The NewTypes stay
# the names code calls and annotates with (a type checker cannot call an Annotated alias).
_token_meta = msgspec.Meta(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description=_ID_RULE)
TaskIdField = Annotated[TaskId, _token_meta]
NodeIdField = Annotated[NodeId, _token_meta]
InstanceIdField = Annotated[InstanceId, _token_meta]
# An event id is not a subject token (derived ids join tokens with '-'), but it is sent back as
# the `Nats-Msg-Id` header when an export is imported: printable ASCII without spaces, bounded.
EventIdField = Annotated[
    EventId,
    msgspec.Meta(pattern=r"^[!-~]{1,256}$(?!\n)", max_length=256, description="1-256 printable ASCII characters"),
]


class InvalidId(ValueError):
    """An id that cannot be used as a NATS subject token."""


def check_token(kind: str, value: str) -> str:
    if not _TOKEN.match(value):
        raise InvalidId(
            f"{kind} {value!r} is not a valid id: use 1-128 characters from A-Z a-z 0-9 _ - "
            "(no dots, spaces or wildcards, since ids are NATS subject tokens)"
        )
    return value


def new_task_id() -> TaskId:
    return TaskId(f"task_{secrets.token_hex(8)}")
