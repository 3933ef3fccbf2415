"""Distinct id types and their validation.

Ids appear as NATS subject tokens (`shoal.ev.task.<task_id>.<kind>`), so they must not contain
the characters NATS gives meaning to.
"""

from __future__ import annotations

import re
import secrets
from typing import NewType

TaskId = NewType("TaskId", str)
NodeId = NewType("NodeId", str)
InstanceId = NewType("InstanceId", str)
EventId = NewType("EventId", str)
KeyId = NewType("KeyId", str)  # names an API key without revealing it (a prefix of its SHA-256)

_TOKEN = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")


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
