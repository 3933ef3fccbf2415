"""When the master could see: its own probes read back, so its blindness is never the nodes' silence.

The master judges a node by when its heartbeats *arrive*. But arrival needs the master's own
reading of SHOAL_TELEMETRY to work: when a NATS server dies, that reading stalls while its
consumer is made again (seconds), and when the master's connection is out it reads nothing.
Judged by arrival alone, every node would then look silent at once, be timed out, and take its
instance and every task in flight with it — the master mistaking its own blindness for the
nodes' death.

So each tick the master publishes a `MasterProbe` on the heartbeats' subjects and reads it back
on the same consumer. A probe sent at `p` and read back promptly proves the master has heard
every heartbeat stored before it: `p` is a *proven point*. A node's silence is counted only up
to the newest proven point, and only over stretches between consecutive proven points that are
close together; a wider stretch was blind (the probes in it were late or lost) and does not count.

- A truly dead node, under good sight, times out within the node timeout plus one probe interval
  and the probe's prompt bound (the newest proven point lags `now` by at most that).
- A blind master times out nobody for its blindness: the newest proven point stops moving while
  it is blind, and the blind stretch is left out once sight returns, so a node whose stored
  beats did not come back (NATS itself was down) gets the rest of its timeout from then.
- A stretch shorter than `gap_ns` is counted even if it hid a short blindness: the error is
  bounded by `gap_ns`, well under any node timeout.

Pure: times are the master's own monotonic ns, passed in; probes are sent and read by one process,
so no other clock is ever compared.
"""

from __future__ import annotations

import collections

NS = 1_000_000_000
PROMPT_SECONDS = 1.0  # a probe read back within this proves sight
BLIND_STRETCHES_KEPT = 256  # older ones only matter to a node silent for hours, timed out long ago


class Sight:
    """Proven points and the blind stretches between them, on one master's clock (ns)."""

    def __init__(self, probe_interval_seconds: float, prompt_seconds: float = PROMPT_SECONDS) -> None:
        self.prompt_ns = int(prompt_seconds * NS)
        self.gap_ns = int((probe_interval_seconds + prompt_seconds) * NS)  # consecutive probes, one late
        self.proven_ns: int | None = None  # the newest proven point: None until the first probe comes back
        self.blind: collections.deque[tuple[int, int]] = collections.deque(maxlen=BLIND_STRETCHES_KEPT)

    def probe_returned(self, sent_ns: int, received_ns: int) -> None:
        """A probe of ours, sent at `sent_ns`, was read back at `received_ns`. A late one proves
        nothing (it sat in a stalled reading or a reconnect buffer); a prompt one after a wide
        stretch ends a blindness."""
        if received_ns - sent_ns > self.prompt_ns:
            return
        if self.proven_ns is not None:
            if sent_ns <= self.proven_ns:
                return  # out of order: nothing newer is proven
            if sent_ns - self.proven_ns > self.gap_ns:
                self.blind.append((self.proven_ns, sent_ns))
        self.proven_ns = sent_ns

    def silence(self, heard_ns: int) -> int:
        """How long a node last heard at `heard_ns` has been silent while the master could see:
        from `heard_ns` to the newest proven point, less the blind stretches in between."""
        if self.proven_ns is None or heard_ns >= self.proven_ns:
            return 0
        seen = self.proven_ns - heard_ns
        for start, end in self.blind:
            seen -= max(0, min(end, self.proven_ns) - max(start, heard_ns))
        return seen

    def blind_for(self, now_ns: int) -> int:
        """How long since the newest proven point (0 before the first): what `/healthz`-style
        logging reports while the master cannot see."""
        return 0 if self.proven_ns is None else max(0, now_ns - self.proven_ns)
