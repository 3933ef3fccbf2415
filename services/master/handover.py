"""Handing a task's request to a node that serves it (`events.handover`): the master's rule, pure,
and the desk that answers the asks.

The rule: `node` (named by the ask's subject, which the server let only that node's runner
publish) gets task T's request only if T is assigned to an instance that has a rank on `node`,
and has not ended. A compromised node can thus learn only the prompts it serves anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
from loguru import logger

from events.catalogue import TaskCreated
from events.handover import HandedOver, HandOverAsk, HandOverRefused, HandOverReply, decode_ask, handover_node
from events.ids import NodeId, TaskId
from events.state import State

ANSWER_WAIT_SECONDS = 10.0  # how long an ask waits for the master's fold to reach its TaskAssigned


def handover_refusal(state: State, node: NodeId, task_id: TaskId) -> str | None:
    """Why `node` may not have `task_id`'s request; None when it may."""
    task = state.tasks.get(task_id)
    if task is None:
        return f"task {task_id} is not in the master's State (unknown, or ended long ago)"
    if task.ended:
        return f"task {task_id} has ended ({task.status})"
    if task.instance_id is None:
        return f"task {task_id} is not assigned to an instance"
    instance = state.instances.get(task.instance_id)
    if instance is None or not any(shard.node_id == node for shard in instance.shards):
        return f"task {task_id} is assigned to instance {task.instance_id}, which has no rank on node {node}"
    return None


class FoldProgress:
    """Wakes those waiting for the master's fold to reach a seq (an ask naming a TaskAssigned the
    master has not folded yet: the rank read it at the same time)."""

    def __init__(self) -> None:
        self._last_seq = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    def advanced(self, last_seq: int) -> None:
        self._last_seq = last_seq
        if not self._waiting:  # the common case: a per-event call costs a comparison
            return
        still: list[tuple[int, asyncio.Future[None]]] = []
        for seq, waiter in self._waiting:
            if seq > last_seq:
                still.append((seq, waiter))
            elif not waiter.done():
                waiter.set_result(None)
        self._waiting = still

    async def reached(self, seq: int, timeout: float) -> bool:
        if self._last_seq >= seq:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((seq, waiter))
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            return False
        finally:
            self._waiting = [(s, w) for s, w in self._waiting if w is not waiter]
        return True


class HandOverDesk:
    """Answers the asks (`events.handover`): waits for the fold to reach the ask's TaskAssigned,
    applies `handover_refusal` to the State, and hands the task's `TaskCreated` read from the log."""

    def __init__(
        self,
        state: Callable[[], State],
        progress: FoldProgress,
        read_created: Callable[[int], Awaitable[object]],
        wait_seconds: float = ANSWER_WAIT_SECONDS,
    ) -> None:
        self._state = state
        self._progress = progress
        self._read_created = read_created
        self._wait_seconds = wait_seconds

    async def answer(self, subject: str, data: bytes) -> HandOverReply:
        try:
            ask: HandOverAsk = decode_ask(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return HandOverRefused(error=f"a malformed ask: {exc}")
        node = NodeId(handover_node(subject))
        if not subject.endswith(f".{ask.task_id}"):
            return HandOverRefused(error=f"the ask for task {ask.task_id} came on {subject!r}")
        if not await self._progress.reached(ask.assigned_seq, self._wait_seconds):
            return HandOverRefused(
                error=f"the master's fold did not reach seq {ask.assigned_seq} within {self._wait_seconds:.0f}s"
            )
        state = self._state()
        refusal = handover_refusal(state, node, ask.task_id)
        if refusal is not None:
            logger.warning("handover to node {} refused: {}", node, refusal)
            return HandOverRefused(error=refusal)
        created = await self._read_created(state.tasks[ask.task_id].created_seq)
        if not isinstance(created, TaskCreated) or created.task_id != ask.task_id:
            return HandOverRefused(error=f"task {ask.task_id}'s TaskCreated could not be read from the log")
        return HandedOver(created=created)
