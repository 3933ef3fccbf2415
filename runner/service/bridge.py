"""The runner's link to the event log, on its own thread, so the MLX thread never awaits.

The MLX thread calls:
- `publish(event)`: queued, appended in order by one task, resent with the same id until the log
  takes it however long NATS is away, up to `publish_backlog_events` waiting: past that the
  task fails loudly (`runner.service.backlog`). A task's chunks queued while the log is behind
  go out as one (`runner.service.coalesce`). Heartbeats go to telemetry, by a task of their
  own: a newer heartbeat replaces an unsent one, and none waits behind the log;
- `is_cancelled(task_id)`: a set lookup, filled by consumers of every task's cancel and the
  control plane's failures *from the log* (a cancel published before the runner looked is not
  missed);
- `next_assignment(timeout)`: the instance's `TaskAssigned`s, in log order on every rank;
- `hand_over(assignment)`: the task's request (`TaskCreated`), asked of the masters on this
  node's handover subject (`events.handover`): a node may not read other nodes' requests from the
  log, so it reads none there;
- `fetch(subject)` / `fetch_entry(subject)`: the newest event on a subject.

Every read is a consumer filtered to one subject, the only kind the server lets a node create
(`services.nats_permissions`).

Every task of the bridge runs in one task group and is meant to run until `close`. One that
crashes, or ends, takes the bridge down: every call above raises `LogBridgeDown` from then on,
and a call already blocked (`next_assignment`, `fetch`) is woken to raise it at once. The runner
ends with that error, and its worker reports the runner failed — never a rank waiting forever
for assignments that a dead consumer will not deliver.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import FIRST_COMPLETED, Future, InvalidStateError, wait
from functools import partial
from typing import Any, NamedTuple, TypeVar

import anyio
import nats.errors
from anyio.abc import TaskGroup
from loguru import logger

from eventlog.appender import Appender
from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from eventlog.publish import LogUnreachable
from events.catalogue import AnyEvent, LogEvent, TaskAssigned, TaskCreated, TaskFailed, TelemetryEvent
from events.handover import HandedOver, HandOverAsk, decode_reply, encode_handover, handover_subject
from events.ids import TaskId
from events.runner_settings import RunnerSettings
from events.stamp import Stamper
from events.subjects import task_subject
from runner.service.backlog import PublishBacklog, task_of
from runner.service.coalesce import Pending, PendingEvents

T = TypeVar("T")
OpenLog = Callable[[NatsEndpoint], Awaitable[EventLog]]


class Assignment(NamedTuple):
    assigned: TaskAssigned
    seq: int  # the TaskAssigned's: the masters answer the ask for its request once they folded it
    created: TaskCreated | None = None  # None: to be handed over (`LogBridge.hand_over`)


class LogBridgeDown(RuntimeError):
    """The bridge carries nothing any more: one of its tasks failed (the message says which and
    why), or it was closed."""


ASSIGNED = task_subject("*", "assigned")
# A cancel, and a failure by the control plane (a node's own failures end with its node): one
# consumer each, since a node may create only consumers filtered to one subject (`RUNNER_READS`).
STOPPING_SUBJECTS = (task_subject("*", "cancelled"), task_subject("*", "failed"))
HANDOVER_ASK_SECONDS = 5.0  # one ask's wait for a master's answer
HANDOVER_GIVE_UP_SECONDS = 60.0  # asks retried this long (a master failing over) before the task fails
PIPELINED_APPENDS = 64  # events of distinct tasks sent in one write (each at most a merged chunk's size)
TELEMETRY_QUEUE = 8  # unsent heartbeats kept while NATS is away; the newest matter, older are dropped


async def open_runner_log(nats: NatsEndpoint) -> EventLog:
    """The runner's log, as the identity its worker gave it (in the environment, never argv)."""
    return await EventLog.connect(nats, name="shoal-runner")


class LogBridge:
    def __init__(
        self,
        nats: NatsEndpoint,
        stamper: Stamper,
        *,
        open_log: OpenLog = open_runner_log,
        backlog_limit: int = RunnerSettings().publish_backlog_events,
    ) -> None:
        """`stamper` stamps the `TaskFailed` of a task whose events the runner could not publish;
        `backlog_limit` holds until the placement's own setting arrives (`limit_backlog`)."""
        self._nats = nats
        self._stamper = stamper
        self._open_log = open_log
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="log-bridge", daemon=True)
        self._closing = asyncio.Event()  # set by `close`: the bridge's tasks stop
        self._log: EventLog | None = None
        self._group: TaskGroup | None = None
        self._opened: Future[None] = Future()
        self._down: Future[None] = Future()  # fails with LogBridgeDown when the bridge stops
        self._down.add_done_callback(self._wake_waiters)
        self._outbox = PendingEvents()  # touched on the bridge's loop only
        self._queued = asyncio.Event()  # set when the outbox may hold something
        self._flushed = asyncio.Event()  # set while the outbox is empty and nothing is being sent
        self._flushed.set()
        self._backlog = PublishBacklog(backlog_limit, self._fail_task)
        self._backlog_lock = threading.Lock()
        self._telemetry: asyncio.Queue[TelemetryEvent] = asyncio.Queue(TELEMETRY_QUEUE)
        self._stopping: set[str] = set()
        self._stopping_lock = threading.Lock()
        self._assignments: collections.deque[Assignment] = collections.deque()
        self._assigned = threading.Condition()

    # --- lifecycle (MLX thread) -------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        self._wait(self._opened, timeout)

    def watch(self, instance_id: str, from_seq: int) -> None:
        """Start consuming assignments for `instance_id` and every task's stop subjects."""
        self._call(partial(self._watch, instance_id, from_seq), 10.0)

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is queued, then stop the bridge's tasks and its thread."""
        if not self._thread.is_alive():
            return
        try:
            self._call(self._flushed.wait, timeout)
        except (LogBridgeDown, TimeoutError) as exc:  # best-effort: the process is exiting anyway
            logger.warning("log bridge closed without flushing its queue: {}", exc)
        self._loop.call_soon_threadsafe(self._closing.set)
        self._thread.join(timeout)

    # --- MLX-thread API ---------------------------------------------------------------------

    def limit_backlog(self, limit: int) -> None:
        """The placement's `publish_backlog_events` (the bridge opens before it is known)."""
        with self._backlog_lock:
            self._backlog.limit = limit

    def publish(self, event: LogEvent | TelemetryEvent) -> None:
        """Queue `event` (thread-safe, never blocks). A log event is kept until the log takes it,
        or, once the backlog is full, replaced by its task's failure (see runner.service.backlog)."""
        self._raise_if_down()
        if isinstance(event, TelemetryEvent):
            self._loop.call_soon_threadsafe(self._queue_telemetry, event)
            return
        with self._backlog_lock:
            admitted = self._backlog.admit(event)
        for queued in admitted:
            if queued is not event and isinstance(queued, TaskFailed):  # the backlog gave the task up
                self._stop_lost_task(queued)
            self._loop.call_soon_threadsafe(self._enqueue, queued)

    def is_cancelled(self, task_id: str) -> bool:
        self._raise_if_down()
        with self._stopping_lock:
            return task_id in self._stopping

    def next_assignment(self, timeout: float) -> Assignment | None:
        """The next assignment, waiting up to `timeout`; 0 only looks (the batch asks at every step,
        and a `Condition.wait` of 0 still swaps locks and may hand the GIL to the bridge's thread)."""
        with self._assigned:
            if timeout > 0:
                self._assigned.wait_for(lambda: self._assignments or self._down.done(), timeout)
            self._raise_if_down()
            return self._assignments.popleft() if self._assignments else None

    def hand_over(self, assignment: Assignment) -> TaskCreated | str:
        """The task's request, or why this rank cannot have it (the masters refused, or none
        answered for `HANDOVER_GIVE_UP_SECONDS`)."""
        if assignment.created is not None:
            return assignment.created
        ask = partial(self._ask_for_request, assignment.assigned.task_id, assignment.seq)
        return self._call(ask, HANDOVER_GIVE_UP_SECONDS + HANDOVER_ASK_SECONDS)

    def fetch(self, subject: str, timeout: float = 10.0) -> AnyEvent | None:
        found = self.fetch_entry(subject, timeout)
        return None if found is None else found[1]

    def fetch_entry(self, subject: str, timeout: float = 10.0) -> tuple[int, AnyEvent] | None:
        """(seq, event) of the newest event on `subject`, or None."""
        return self._call(partial(self._get_last, subject), timeout)

    # --- between the threads ----------------------------------------------------------------

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        """Run a coroutine on the bridge's loop and wait for its result (or the bridge going down)."""
        self._raise_if_down()
        return self._wait(asyncio.run_coroutine_threadsafe(make(), self._loop), timeout)

    def _wait(self, future: Future[T], timeout: float) -> T:
        either: list[Future[Any]] = [future, self._down]
        done, _ = wait(either, timeout, return_when=FIRST_COMPLETED)
        if future in done:
            return future.result()
        future.cancel()
        self._raise_if_down()
        raise TimeoutError(f"the log bridge did not answer within {timeout}s")

    def _raise_if_down(self) -> None:
        if self._down.done():
            failure = self._down.exception()
            raise LogBridgeDown(str(failure)) from failure

    def _go_down(self, failure: LogBridgeDown) -> None:
        try:
            self._down.set_exception(failure)
        except InvalidStateError:
            pass  # already down: the first cause stands

    def _wake_waiters(self, _down: Future[None]) -> None:
        with self._assigned:
            self._assigned.notify_all()

    # --- loop side --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._go_down(LogBridgeDown("the log bridge is closed"))  # no-op after a failure

    async def _serve(self) -> None:
        """Open the log, then run the bridge's tasks in one group until `close` or a failure."""
        try:
            log = await self._open_log(self._nats)
        except Exception as exc:
            self._go_down(LogBridgeDown(f"cannot open the event log at {self._nats.url}: {exc}"))
            return
        appender = Appender(self._nats, log.settings.retry_seconds, name="shoal-runner-append")
        try:
            async with anyio.create_task_group() as group:
                self._log, self._group = log, group
                publisher = partial(self._publisher, log, appender)
                group.start_soon(self._supervise, "publisher", publisher, group.cancel_scope)
                telemetry = partial(self._telemetry_publisher, log)
                group.start_soon(self._supervise, "telemetry publisher", telemetry, group.cancel_scope)
                self._opened.set_result(None)
                await self._closing.wait()
                group.cancel_scope.cancel()
        finally:
            appender.close()
            with anyio.CancelScope(shield=True):
                await log.close()

    async def _supervise(self, name: str, loop: Callable[[], Awaitable[None]], group: anyio.CancelScope) -> None:
        """Run one of the bridge's loops. They run until cancelled, so any end is a failure: it
        takes the bridge down at once (waking every waiter), then stops the `group`'s tasks."""
        try:
            await loop()
            failure = LogBridgeDown(f"the log bridge's {name} stopped")
        except Exception as exc:
            logger.exception("the log bridge's {} crashed", name)
            failure = LogBridgeDown(f"the log bridge's {name} crashed: {type(exc).__name__}: {exc}")
        self._go_down(failure)
        group.cancel()

    async def _watch(self, instance_id: str, from_seq: int) -> None:
        assert self._group is not None and self._log is not None  # `start` returned, so both are set
        group, log = self._group, self._log
        consume = partial(self._consume_assignments, log, instance_id, from_seq)
        group.start_soon(self._supervise, "assignment consumer", consume, group.cancel_scope)
        for subject in STOPPING_SUBJECTS:
            stops = partial(self._consume_stops, log, from_seq, subject)
            group.start_soon(self._supervise, f"{subject} consumer", stops, group.cancel_scope)

    def _enqueue(self, event: LogEvent) -> None:
        try:
            self._outbox.push(event)
        except Exception as exc:  # never lose it silently: its task fails instead (a failure is not merged)
            logger.exception("cannot queue {} for the log", type(event).__name__)
            self._refused(event, f"it could not be queued: {exc}")
            return
        self._flushed.clear()
        self._queued.set()

    async def _next_pending(self) -> list[Pending]:
        while not (pending := self._outbox.pop_distinct(PIPELINED_APPENDS)):
            self._flushed.set()
            self._queued.clear()
            await self._queued.wait()
        return pending

    async def _publisher(self, log: EventLog, appender: Appender) -> None:
        """Append the outbox in order; the oldest event is resent (same id) until the log takes it.
        Through an `Appender`: a single stream appends a chunk per token, and nats-py's request
        path costs the runner twice the CPU (and GIL) per append. The events waiting together (at
        most one per task, `PendingEvents.pop_distinct`) go out in one write; what that one try
        did not store goes one by one, in order, resent until stored or refused."""
        while True:
            pending = await self._next_pending()
            try:
                with self._backlog_lock:
                    wanted = [p.event for p in pending if self._backlog.still_wanted(p.event)]
                seqs = await appender.append_pipelined(wanted) if len(wanted) > 1 else [None] * len(wanted)
                for event, seq in zip(wanted, seqs, strict=True):
                    with self._backlog_lock:  # an earlier one's resend may have outlived the backlog
                        resend = seq is None and self._backlog.still_wanted(event)
                    if resend:
                        await self._append_until_stored(log, appender, event)
            finally:
                with self._backlog_lock:
                    self._backlog.stored(sum(p.made for p in pending))

    async def _append_until_stored(self, log: EventLog, appender: Appender, event: LogEvent) -> None:
        """After a long outage the duplicate window may be over: if the first send was stored but
        its acknowledgement lost, a resend would store a chunk twice. So a resend first asks."""
        resending = False
        while True:
            try:
                if not (resending and await log.is_newest_on_its_subject(event)):
                    await appender.append(event)
                return
            except LogUnreachable as exc:  # NATS is away: keep the event, and everything behind it
                resending = True
                logger.warning("still cannot publish ({} events waiting): {}", self._backlog.waiting, exc)
            except Exception as exc:  # refused for good (permissions, size, a bug): its task fails, not the runner
                logger.error("the log refused {}: {}: {}", type(event).__name__, type(exc).__name__, exc)
                self._refused(event, str(exc))
                return

    def _refused(self, event: LogEvent, error: str) -> None:
        """A task whose event the log refused has a hole: fail it, after what was stored of it."""
        task_id = task_of(event)
        if task_id is None or isinstance(event, TaskFailed):
            return
        with self._backlog_lock:
            refused = f"the log refused its {type(event).__name__}: {error}"
            failed = self._backlog.give_up(task_id, refused, cut_queued=True)
        self._stop_lost_task(failed)
        self._enqueue(failed)

    def _fail_task(self, task_id: TaskId, error: str) -> TaskFailed:
        return TaskFailed(env=self._stamper.stamp(), task_id=task_id, error=error, rank=self._stamper.origin.rank)

    def _stop_lost_task(self, failed: TaskFailed) -> None:
        """The ranks stop a task whose output can no longer reach the log (as they stop a cancel)."""
        logger.error("task {} failed: {}", failed.task_id, failed.error)
        with self._stopping_lock:
            self._stopping.add(failed.task_id)

    def _queue_telemetry(self, event: TelemetryEvent) -> None:
        if self._telemetry.full():
            self._telemetry.get_nowait()  # the oldest unsent heartbeat says least
        self._telemetry.put_nowait(event)

    async def _telemetry_publisher(self, log: EventLog) -> None:
        while True:
            event = await self._telemetry.get()
            try:
                await log.publish_telemetry(event)
            except Exception as exc:  # a heartbeat is not worth a wait: a newer one follows
                logger.debug("could not publish {}: {}", type(event).__name__, exc)

    async def _consume_assignments(self, log: EventLog, instance_id: str, from_seq: int) -> None:
        """The instance's assignments, in log order."""
        async for seq, event in log.follow(from_seq=from_seq, subjects=[ASSIGNED]):
            if isinstance(event, TaskAssigned) and event.instance_id == instance_id:
                with self._assigned:
                    self._assignments.append(Assignment(event, seq))
                    self._assigned.notify_all()

    async def _ask_for_request(self, task_id: TaskId, assigned_seq: int) -> TaskCreated | str:
        """Ask the masters on this node's handover subject until one answers, for up to
        `HANDOVER_GIVE_UP_SECONDS` (none may be there: a master restarting, or failing over)."""
        assert self._log is not None  # `start` returned, so the log is open
        subject = handover_subject(self._stamper.origin.node, task_id)
        payload = encode_handover(HandOverAsk(task_id=task_id, assigned_seq=assigned_seq))
        give_up = asyncio.get_running_loop().time() + HANDOVER_GIVE_UP_SECONDS
        while True:
            try:
                answer = decode_reply(await self._log.ask(subject, payload, HANDOVER_ASK_SECONDS))
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
                if asyncio.get_running_loop().time() > give_up:
                    return f"no master handed its request over within {HANDOVER_GIVE_UP_SECONDS:.0f}s ({exc})"
                logger.warning("task {}: asking the masters for its request again: {!r}", task_id, exc)
                await asyncio.sleep(0.5)
                continue
            return answer.created if isinstance(answer, HandedOver) else answer.error

    async def _consume_stops(self, log: EventLog, from_seq: int, subject: str) -> None:
        async for _seq, event in log.follow(from_seq=from_seq, subjects=[subject]):
            task_id = getattr(event, "task_id", None)
            if task_id is not None:
                if isinstance(event, TaskFailed) and event.env.origin.service == "runner":
                    continue  # a rank's own failure report is not a reason for the others to stop
                with self._stopping_lock:
                    self._stopping.add(task_id)

    async def _get_last(self, subject: str) -> tuple[int, AnyEvent] | None:
        assert self._log is not None  # `start` returned, so the log is open
        return await self._log.get_last(subject)
