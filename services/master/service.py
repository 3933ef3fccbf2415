"""The master shell: fold the log, call the core, publish its decisions; tick the watchdog.

It decides on an event only once its own earlier decisions are back in its State (it waits
for their sequence numbers), so it never decides twice on a State that lacks its last decision.

Several masters may run: each folds the log and follows the heartbeats, but only the holder of
the lease (`services/master/lease.py`) decides. A stand-by that takes over runs `reconcile` on
its State, which is current, so the take-over costs no replay; a leader whose lease lapses stops
deciding at once (`_publish` asks the lease before every write).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import time
from collections.abc import Callable, Sequence

import msgspec
from loguru import logger

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from events.catalogue import ChunkGenerated, LogEvent, MasterProbe, ModelLoadRequested, Origin, TaskCreated
from events.fold import apply_live
from events.handover import HandOverRefused, encode_handover, handover_subject
from events.origins import heartbeat_refusal
from events.retention import live_tasks_of
from events.stamp import Stamper
from events.state import FINISHED_TASKS_KEPT, State
from events.subjects import PREFIX, event_subjects_without
from services.master.core import MasterCore, MasterPolicy, ModelCatalog
from services.master.handover import FoldProgress, HandOverDesk
from services.master.hearing import Hearing
from services.master.lease import DEFAULT_LEASE_SECONDS, KvLease, Leadership
from services.master.lifecycle import IdleClock, WaitClock, operator_loaded
from services.master.model_lookup import LookedUpCatalog
from services.master.placement import RetryClock
from services.master.snapshots import SnapshotWriter
from services.master.watchdog import tick

LOOP_LATE_SECONDS = 3.0  # a tick this late is logged: the event loop was blocked, or the process was not scheduled
OWN_DECISIONS_WAIT_SECONDS = 10.0  # a master taking over waits this long at most for its own last decisions


class MasterSettings(msgspec.Struct, frozen=True, kw_only=True):
    nats: NatsEndpoint  # URL, TLS files and the master's identity
    policy: MasterPolicy
    tick_seconds: float = 0.5
    name: str = msgspec.field(default_factory=lambda: f"master-{socket.gethostname()}-{os.getpid()}")  # lease holder
    master_lease_seconds: float = DEFAULT_LEASE_SECONDS
    finished_tasks_kept: int = FINISHED_TASKS_KEPT
    snapshot_every_events: int = 10_000


class Master:
    def __init__(
        self,
        settings: MasterSettings,
        catalog: ModelCatalog,
        *,
        wall_ns: Callable[[], int] = time.time_ns,
        mono_ns: Callable[[], int] = time.monotonic_ns,  # every duration the watchdog measures
        leadership: Leadership | None = None,  # default: the KV lease; tests force a leader
    ) -> None:
        self.settings = settings
        self._forced_leadership = leadership
        self.leadership: Leadership | None = leadership
        self.stamper = Stamper(Origin(service="master"), wall_ns=wall_ns, mono_ns=mono_ns)
        self.catalog = LookedUpCatalog(catalog, settings.policy.models)  # looked up off the loop
        self.core = MasterCore(settings.policy, self.catalog, self.stamper)
        self.wall_ns = wall_ns
        self.mono_ns = mono_ns
        self.state = State()
        self.hearing = Hearing(settings.name, settings.tick_seconds)  # by the master's own clock and sight
        self.idle_clock = IdleClock()
        self.wait_clock = WaitClock()
        self.retry_clock = RetryClock()
        self._awaiting_seq = 0
        self._undecided: collections.deque[LogEvent] = collections.deque()
        self._log: EventLog | None = None
        self._snapshots: SnapshotWriter | None = None
        self._blind = False  # whether the master's own probes stopped coming back (logged once per change)
        self._progress = FoldProgress()  # for the handover's asks, which may run ahead of the fold

    async def run(self, ready: asyncio.Event | None = None) -> None:
        log = await EventLog.connect(self.settings.nats, name="shoal-master")
        self._log = log
        try:
            async with contextlib.AsyncExitStack() as stack:
                self.leadership = self._forced_leadership  # a run's own lease: a supervised restart opens a new one
                if self.leadership is None:
                    name, lease = self.settings.name, self.settings.master_lease_seconds
                    self.leadership = await stack.enter_async_context(KvLease.open(self.settings.nats, name, lease))
                await self._serve(log, self.leadership, ready)
        finally:
            await log.close()

    async def _serve(self, log: EventLog, leadership: Leadership, ready: asyncio.Event | None) -> None:
        self.state = await log.fold(from_snapshot=True, finished_tasks_kept=self.settings.finished_tasks_kept)
        await self.catalog.look_up()  # before any decision: the core never waits on a fetch
        await self.catalog.add([*operator_loaded(self.state), *(t.model for t in live_tasks_of(self.state))])
        self._snapshots = SnapshotWriter(log, self.settings.snapshot_every_events, self.state)
        logger.info("master {} resumed at seq {}", self.settings.name, self.state.last_seq)
        transitions: asyncio.Queue[bool] = asyncio.Queue()
        self._progress.advanced(self.state.last_seq)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._hand_over(log, group))
            group.create_task(leadership.keep(transitions))
            group.create_task(self._follow_leadership(transitions))
            group.create_task(self._follow_heartbeats(log))
            group.create_task(self._tick_loop())
            group.create_task(self._look_up_models())
            if ready is not None:
                ready.set()
            # No chunks: the master decides nothing on one, and learns a decoding batch's progress
            # from its ranks' heartbeats (`hearing.activity_tokens`); snapshots fold them in
            # (`snapshots.SnapshotWriter`).
            kept = event_subjects_without(ChunkGenerated)
            async for seq, event, subject in log.deliveries(self.state.last_seq + 1, kept):
                await self._on_event(seq, event, subject)

    async def _hand_over(self, log: EventLog, group: asyncio.TaskGroup) -> None:
        """Answer the ranks' asks for their tasks' requests (`events.handover`), each by a task of
        its own: an ask may wait for the fold, and must not hold up the next one. Every master
        answers every ask (leading or standing by: each folds the log), and the asker takes the
        first answer (`events.handover`: one that cannot answer then costs nothing)."""
        desk = HandOverDesk(lambda: self.state, self._progress, log.get)
        async for subject, data, reply in log.asks(handover_subject("*", "*")):
            if reply:
                group.create_task(self._answer(log, desk, subject, data, reply))

    async def _answer(self, log: EventLog, desk: HandOverDesk, subject: str, data: bytes, reply: str) -> None:
        answer = await desk.answer(subject, data)
        try:
            await log.respond(reply, encode_handover(answer))
        except Exception as exc:  # one lost answer is not the master's end; the asker is told why
            logger.warning("master: could not answer the ask on {}: {}", subject, exc)
            refused = HandOverRefused(error=f"the master could not send the request: {type(exc).__name__}: {exc}")
            with contextlib.suppress(Exception):  # lost too: the asker asks again
                await log.respond(reply, encode_handover(refused))

    async def _follow_leadership(self, transitions: asyncio.Queue[bool]) -> None:
        """Say so on each change; on taking over, decide what is owed (the State is current)."""
        name = self.settings.name
        while True:
            if await transitions.get():
                # A leader whose lease lapsed a moment ago may have decisions on their way to its
                # State still: it reconciles once they are in, not on a State that lacks them.
                await self._progress.reached(self._awaiting_seq, OWN_DECISIONS_WAIT_SECONDS)
                logger.info("master {} leading at seq {}", name, self.state.last_seq)
                await self._publish(self.core.reconcile(self.state))
            elif self._undecided or self._awaiting_seq:
                logger.warning("master {} lost the lease: standing by", name)
                self._undecided.clear()  # whoever leads now reconciles them
            else:
                logger.info("master {} standing by (another master leads)", name)

    def _leading(self) -> bool:
        return self.leadership is not None and self.leadership.leading()

    async def _on_event(self, seq: int, event: LogEvent, subject: bytes) -> None:
        self.state, error = apply_live(self.state, seq, event, subject)
        self._progress.advanced(self.state.last_seq)
        if error is not None:
            logger.warning("master: skipping seq {}: {}", seq, error)
            return
        if not self._leading():
            return  # a stand-by only folds; on taking over it reconciles the State
        if isinstance(event, ModelLoadRequested | TaskCreated):
            await self.catalog.add([event.model])  # a model new to it: looked up off the loop, then decided on
        self._undecided.append(event)
        if seq < self._awaiting_seq:
            return  # our own last decision is not folded yet
        while self._undecided:
            await self._publish(self.core.decide(self.state, self._undecided.popleft()))
            if self._awaiting_seq > self.state.last_seq:
                return

    async def _publish(self, decisions: Sequence[LogEvent]) -> None:
        if not decisions or self._log is None or not self._leading():
            return
        for event in decisions:
            logger.info("master decides {}", _describe(event))
        seqs = await self._log.append_many(decisions)
        self._awaiting_seq = max(self._awaiting_seq, *seqs)

    async def _tick_loop(self) -> None:
        while True:
            asleep_since = time.monotonic()  # the process's real time, whatever clock the master decides by
            await asyncio.sleep(self.settings.tick_seconds)
            late = time.monotonic() - asleep_since - self.settings.tick_seconds
            if late > LOOP_LATE_SECONDS:  # nothing was decided meanwhile: say so, for whoever reads why
                logger.warning(
                    "master {}: its tick came {:.1f}s late (its event loop was blocked, or the process did not run)",
                    self.settings.name,
                    late,
                )
            await self._probe()
            # Every master notices, leading or not: a stand-by that takes over keeps the times it
            # first saw each task and node, so a take-over restarts no deadline.
            now = self.mono_ns()
            self.hearing.notice(self.state, now, self.wall_ns())  # what is new counts from now
            if self._snapshots is not None and not self._leading():
                await self._snapshots.write_if_due(self.state, store=False)  # ready to take over
            if self._awaiting_seq > self.state.last_seq or not self._leading():
                continue
            decisions = tick(self.state, now, self.hearing.liveness(), self.settings.policy, self.stamper)
            seconds = self.mono_ns() / 1e9  # the idle and waiting clocks are this master's own
            unloads = self.core.unload_idle(self.state, self.idle_clock.observe(self.state, seconds))
            replicas = self.core.grow_replicas(self.state, self.wait_clock.observe(self.state, seconds))
            retries = self.core.retry_placements(self.state, self.retry_clock.observe(self.state, seconds))
            await self._publish([*decisions, *unloads, *(replicas or retries)])
            if self._snapshots is not None:
                await self._snapshots.write_if_due(self.state)

    async def _look_up_models(self) -> None:
        """Models that failed to resolve are tried again now and then, in a thread, off the ticks."""
        while True:
            await asyncio.sleep(self.settings.tick_seconds)
            await self.catalog.look_up(only_due=True)

    async def _probe(self) -> None:
        """Send this tick's probe (every master does: a stand-by that takes over needs its sight
        proven already); say so when the master has been blind for longer than a node timeout."""
        if self._log is None:
            return
        probe = MasterProbe(env=self.stamper.stamp(), master=self.settings.name)
        try:
            await self._log.publish_telemetry(probe)
        except Exception as exc:  # a lost probe is what the sight's gap rule is for
            logger.debug("master probe not sent: {!r}", exc)
        blind = self.hearing.sight.blind_for(self.mono_ns()) > self.settings.policy.node_timeout_seconds * 1e9
        if blind != self._blind:
            self._blind = blind
            if blind:
                logger.warning(
                    "master {} cannot read its own probes back: no node is timed out meanwhile", self.settings.name
                )
            else:
                logger.info("master {} reads its probes back again", self.settings.name)

    async def _follow_heartbeats(self, log: EventLog) -> None:
        start = await log.last_seq("telemetry") + 1
        async for _seq, beat, subject in log.deliveries(start, [f"{PREFIX}.hb.>"], stream="telemetry"):
            refusal = heartbeat_refusal(self.state, beat, subject)
            if refusal is not None:  # a node beating for another: never proof that one is alive
                logger.warning("master {}: ignoring a heartbeat: {}", self.settings.name, refusal)
                continue
            self.hearing.heard(beat, self.mono_ns())  # the arrival on our clock, not the sender's stamp


def _describe(event: LogEvent) -> str:
    fields = {k: v for k, v in msgspec.structs.asdict(event).items() if k != "env"}
    return f"{type(event).__name__} {fields}"[:300]
