"""A task's request handed to the node that serves it (docs/ARCHITECTURE.md §11).

Workers and runners may not read the tasks' `TaskCreated` (every prompt of the cluster) from the
log. A rank reads its instance's `TaskAssigned`s (ids only) in log order, as before, and asks the
control plane for each task's request on its own node's subject, `handover_subject(node, task)`,
which the server lets only that node's runner publish; a master answers from its State (the task
must be assigned to an instance with a rank on that node: `services.master.handover`) with the
task's `TaskCreated` as the log stores it, or says why not. Every master answers every ask (not a
queue group, which hands each ask to one member) and the asker takes the first answer: a master the
server still counts as subscribed but that cannot answer (partitioned away, frozen, its fold blind)
would otherwise swallow the asks the server hands it until the server drops its connection,
minutes later. The request never enters the log
twice, and no node can ask for a task it does not serve.
"""

from __future__ import annotations

import msgspec

from events.catalogue import TaskCreated
from events.ids import TaskIdField
from events.subjects import PREFIX


class HandOverAsk(msgspec.Struct, frozen=True, kw_only=True):
    """`assigned_seq`: where the asking rank read the task's `TaskAssigned`; the master answers
    once its own fold has reached it."""

    task_id: TaskIdField
    assigned_seq: int


class HandedOver(msgspec.Struct, frozen=True, kw_only=True, tag="handed_over"):
    created: TaskCreated


class HandOverRefused(msgspec.Struct, frozen=True, kw_only=True, tag="refused"):
    error: str


HandOverReply = HandedOver | HandOverRefused

_ask_decoder = msgspec.msgpack.Decoder(HandOverAsk)
_reply_decoder = msgspec.msgpack.Decoder(HandOverReply)
_encoder = msgspec.msgpack.Encoder()


def handover_subject(node: str, task_id: str) -> str:
    """Where `node`'s runners ask for `task_id`'s request (outside every stream: never stored)."""
    return f"{PREFIX}.handover.{node}.{task_id}"


def handover_node(subject: str) -> str:
    """The node a handover subject names (the server checked it against the asker's identity)."""
    return subject.split(".")[2]


def encode_handover(message: HandOverAsk | HandOverReply) -> bytes:
    return _encoder.encode(message)


def decode_ask(data: bytes) -> HandOverAsk:
    """Raises `msgspec.ValidationError` / `msgspec.DecodeError` for a malformed ask."""
    return _ask_decoder.decode(data)


def decode_reply(data: bytes) -> HandOverReply:
    return _reply_decoder.decode(data)
