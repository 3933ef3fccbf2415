"""The master shell: fold the log, call the core, publish its decisions; tick the watchdog.

It decides on an event only once its own earlier decisions are back in its State (it waits
for their sequence numbers), so it never decides twice on a State that lacks its last decision.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence

import msgspec
from loguru import logger

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from events.catalogue import LogEvent, NodeHeartbeat, Origin, RunnerHeartbeat
from events.fold import apply_live
from events.ids import NodeId
from events.stamp import Stamper
from events.state import State
from events.subjects import PREFIX
from services.master.core import MasterCore, MasterPolicy, ModelCatalog
from services.master.watchdog import Liveness, RunnerKey, tick


class MasterSettings(msgspec.Struct, frozen=True, kw_only=True):
    nats: NatsEndpoint  # URL, TLS files and the master's identity
    policy: MasterPolicy
    tick_seconds: float = 0.5


class Master:
    def __init__(
        self, settings: MasterSettings, catalog: ModelCatalog, *, wall_ns: Callable[[], int] = time.time_ns
    ) -> None:
        self.settings = settings
        self.stamper = Stamper(Origin(service="master"), wall_ns=wall_ns)
        self.core = MasterCore(settings.policy, catalog, self.stamper)
        self.wall_ns = wall_ns
        self.state = State()
        self.node_last_seen: dict[NodeId, int] = {}
        self.runner_beats: dict[RunnerKey, RunnerHeartbeat] = {}  # the newest of each runner
        self._awaiting_seq = 0
        self._undecided: collections.deque[LogEvent] = collections.deque()
        self._log: EventLog | None = None

    async def run(self, ready: asyncio.Event | None = None) -> None:
        log = await EventLog.connect(self.settings.nats, name="shoal-master")
        self._log = log
        try:
            self.state = await log.fold()
            logger.info("master resumed at seq {}", self.state.last_seq)
            started = self.wall_ns()  # heartbeats from before this start were not watched: count from now
            self.node_last_seen = {node_id: started for node_id in self.state.nodes}
            await self._publish(self.core.reconcile(self.state))
            async with asyncio.TaskGroup() as group:
                group.create_task(self._follow_heartbeats(log))
                group.create_task(self._tick_loop())
                if ready is not None:
                    ready.set()
                async for seq, event in log.follow(from_seq=self.state.last_seq + 1):
                    await self._on_event(seq, event)
        finally:
            await log.close()

    async def _on_event(self, seq: int, event: LogEvent) -> None:
        self.state, error = apply_live(self.state, seq, event)
        if error is not None:
            logger.warning("master: skipping seq {}: {}", seq, error)
            return
        self._undecided.append(event)
        if seq < self._awaiting_seq:
            return  # our own last decision is not folded yet
        while self._undecided:
            await self._publish(self.core.decide(self.state, self._undecided.popleft()))
            if self._awaiting_seq > self.state.last_seq:
                return

    async def _publish(self, decisions: Sequence[LogEvent]) -> None:
        if not decisions or self._log is None:
            return
        for event in decisions:
            logger.info("master decides {}", _describe(event))
        seqs = await self._log.append_many(decisions)
        self._awaiting_seq = max(self._awaiting_seq, *seqs)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_seconds)
            if self._awaiting_seq > self.state.last_seq:
                continue
            liveness = Liveness(nodes=self.node_last_seen, runners=self.runner_beats)
            now = self.wall_ns()
            decisions = tick(self.state, now, liveness, self.settings.policy, self.stamper)
            await self._publish([*decisions, *self.core.retry_placements(self.state, now)])

    async def _follow_heartbeats(self, log: EventLog) -> None:
        start = await log.last_seq("telemetry") + 1
        async for _seq, beat in log.follow(from_seq=start, subjects=[f"{PREFIX}.hb.>"], stream="telemetry"):
            if isinstance(beat, NodeHeartbeat):
                self.node_last_seen[beat.node_id] = beat.env.wall_time
            else:
                self.runner_beats[(beat.instance_id, beat.rank)] = beat


def _describe(event: LogEvent) -> str:
    fields = {k: v for k, v in msgspec.structs.asdict(event).items() if k != "env"}
    return f"{type(event).__name__} {fields}"[:300]
