"""Stage boundaries of a pipeline shard, and the object that owns their pending sends.

The last owned layer of a non-final rank hands its output to `PendingSends` instead of sending
it at once. The engine decides when those sends go out (right away on the sequential path and
in decode; only after the iteration's agreement collective on the pipeline path) and makes
sure none is left queued or in flight when a path ends, cancel and error included.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from runner.engine.protocols import PeerWait


class PendingSends:
    """Sends produced by one rank, from creation to completion. Owned by one Engine."""

    def __init__(self) -> None:
        self._queued: list[tuple[mx.array, mx.array]] = []  # (activation, send op), not started
        self._in_flight: list[mx.array] = []  # send ops started with async_eval

    def add(self, activation: mx.array, send_op: mx.array) -> None:
        self._queued.append((activation, send_op))

    def activations(self) -> list[mx.array]:
        """What to compute in this iteration, without starting any transfer."""
        return [activation for activation, _ in self._queued]

    def take_all(self, since: int = 0) -> list[mx.array]:
        """Activations and send ops, for a synchronous eval that computes and sends at once; from
        `since` (a `mark`) on: the sends queued before it wait for their agreement (pipelined decode)."""
        taken = [array for pair in self._queued[since:] for array in pair]
        del self._queued[since:]
        return taken

    def mark(self) -> int:
        return len(self._queued)

    def flush(self) -> None:
        """Start the queued sends (pipeline path, after the agreement said "continue"), one at a
        time in the order queued: the receiver reads them in that order (a step may queue several:
        prompt chunks, then a micro-batch of rows), and one evaluation of several independent sends
        need not run them in the order given."""
        self.start([send_op for _, send_op in self._queued])
        self._queued.clear()

    def start(self, send_ops: list[mx.array]) -> None:
        """Start sends taken out of the queue earlier (`take_all`), one at a time in this order."""
        for send_op in send_ops:
            mx.async_eval(send_op)
            self._in_flight.append(send_op)

    def complete(self) -> None:
        """Wait for every started send. Their receivers are committed to them by agreement."""
        if self._in_flight:
            mx.eval(self._in_flight)
            self._in_flight.clear()

    def discard_queued(self) -> None:
        """Drop sends the group agreed not to make (cancel), then finish the started ones."""
        self._queued.clear()
        self.complete()

    def abandon(self) -> None:
        """After a failed collective: forget everything without waiting (the peer may be gone)."""
        self._queued.clear()
        self._in_flight.clear()

    def is_empty(self) -> bool:
        return not self._queued and not self._in_flight


class ReceiveGate:
    """Where a receive from the previous rank waits for its bytes. The boundary layer only `arm`s
    it while the forward's graph is built; the engine calls `wait` once the whole graph is built,
    just before evaluating it, so the rank builds its layers while its neighbour still computes,
    then blocks in `PeerWait` (no CPU) instead of in the ring backend, which spins while a receive
    is queued (`runner/ring_wait.py`). The send it waits for never waits on this rank: it comes in
    the same step before the agreement, or was flushed after the previous one. Without a
    `PeerWait` (one rank, tests) it does nothing; a forward that skips `wait` only spins."""

    def __init__(self, peer_wait: PeerWait | None = None) -> None:
        self._peer_wait = peer_wait
        self._armed = False

    def arm(self) -> None:
        self._armed = self._peer_wait is not None

    def wait(self) -> None:
        if self._armed and self._peer_wait is not None:
            self._armed = False
            self._peer_wait.wait()


class PassThroughLayer(nn.Module):
    """Stands in for a layer another rank owns: no weights, hands its input on unchanged.

    Keeps the original layer's plain attributes (e.g. llama's `use_sliding`), because model
    code reads them to choose masks.
    """

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        for name, value in vars(original).items():
            if not name.startswith("_") and isinstance(value, (bool, int, float, str, type(None))):
                object.__setattr__(self, name, value)

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        return x


class StageBoundaryLayer(nn.Module):
    """Wraps the first and/or last owned layer of a rank with the recv / send to its neighbours."""

    def __init__(
        self,
        inner: nn.Module,
        *,
        recv_from: int | None,
        send_to: int | None,
        group: mx.distributed.Group,
        outbox: PendingSends,
        receive_gate: ReceiveGate | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self._recv_from = recv_from
        self._send_to = send_to
        self._group = group
        self._outbox = outbox
        self._receive_gate = receive_gate

    def __getattr__(self, name: str) -> Any:
        # Model code reads per-layer attributes (e.g. `use_sliding`); answer for the inner layer.
        if name in self:
            return self[name]
        inner = self.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if self._recv_from is not None:
            if self._receive_gate is not None:
                self._receive_gate.arm()
            # Shape and dtype come from the local embedding, the values from the previous rank.
            x = mx.distributed.recv_like(x, self._recv_from, group=self._group)
        output = self.inner(x, *args, **kwargs)
        if self._send_to is not None:
            self._outbox.add(output, mx.distributed.send(output, self._send_to, group=self._group))
        return output
