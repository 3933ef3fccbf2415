"""How long each instance took to warm up, read from the log (pure): from its `InstancePlaced` to
the first moment every one of its ranks had reported ready (`RunnerStatusChanged` to a serving
status), both by the events' wall clocks (`env.wall_time`: the master's and the runners' clocks,
one host's clock on a one-host cluster). The same moment `State` marks as an instance's
`became_ready_at`, kept here for every instance of the run, retired ones included. Where the time
went is told too: until every rank had reported `loading` (the runner processes started and
imported mlx), then `warming_up` (the weights loaded), then ready (a tiny task through every path)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.catalogue import InstancePlaced, LogEvent, RunnerStatusChanged
from events.vocabulary import SERVING_STATUSES, RunnerStatus

EARLIER_STATUSES: tuple[RunnerStatus, ...] = ("loading", "warming_up")


@dataclass(frozen=True, slots=True)
class Warmup:
    instance_id: str
    model: str
    placed_seq: int  # the InstancePlaced's position in the log
    placed_ns: int
    ready_ns: int | None  # None: not every rank reported ready (yet)
    # When every rank had reached each earlier status (wall ns); None if one skipped it.
    reached_ns: dict[str, int] = field(default_factory=dict[str, int])

    @property
    def ms(self) -> float | None:
        return None if self.ready_ns is None else (self.ready_ns - self.placed_ns) / 1e6

    def phases_ms(self) -> dict[str, float | None]:
        """ms from placement until every rank was `loading`, `warming_up` and ready."""
        moments = {status: self.reached_ns.get(status) for status in EARLIER_STATUSES}
        moments["ready"] = self.ready_ns
        return {status: None if ns is None else (ns - self.placed_ns) / 1e6 for status, ns in moments.items()}


def warmups(events: Iterable[tuple[int, LogEvent]]) -> list[Warmup]:
    """Every instance placed in `events` ((seq, event) in log order), in placement order."""
    placed: dict[str, tuple[InstancePlaced, int]] = {}
    ranks_at: dict[tuple[str, str], set[int]] = {}  # (instance, status) -> ranks that reached it
    reached: dict[str, dict[str, int]] = {}  # instance -> status -> when its last rank reached it
    for seq, event in events:
        if isinstance(event, InstancePlaced):
            placed[event.instance_id] = (event, seq)
            reached[event.instance_id] = {}
        elif isinstance(event, RunnerStatusChanged) and event.instance_id in placed:
            status = "ready" if event.status in SERVING_STATUSES else event.status
            if status in reached[event.instance_id]:
                continue
            ranks = ranks_at.setdefault((event.instance_id, status), set())
            ranks.add(event.rank)
            if len(ranks) == len(placed[event.instance_id][0].shards):
                reached[event.instance_id][status] = event.env.wall_time
    found: list[Warmup] = []
    for instance_id, (event, seq) in placed.items():
        moments = reached[instance_id]
        earlier = {status: moments[status] for status in EARLIER_STATUSES if status in moments}
        found.append(Warmup(instance_id, event.model, seq, event.env.wall_time, moments.get("ready"), earlier))
    return found


def first_warmup(found: Iterable[Warmup], model: str) -> Warmup | None:
    """`model`'s first placement that warmed up (the one `shoal up` made, in a fresh log)."""
    return next((w for w in sorted(found, key=lambda w: w.placed_seq) if w.model == model and w.ready_ns), None)
