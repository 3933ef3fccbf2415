"""The worker shell: announce the node, heartbeat, fold the log, and keep the runner processes
equal to the plan. Everything it decides is in `plan.py`; here is only I/O.

The node is announced at start, again after every reconnect to NATS (the log may have timed it
out, or been replaced, meanwhile), and again whenever the log says it timed out or left while
this worker runs (`plan.rejoin_cause`): a node whose heartbeats were held up comes back by itself.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from loguru import logger

from eventlog.endpoint import NatsEndpoint
from eventlog.families import fold_families, follow_families
from eventlog.log import EventLog
from eventlog.publish import LogError
from events.catalogue import (
    LinkMeasured,
    LogEvent,
    NodeHeartbeat,
    NodeJoined,
    NodeLeft,
    Origin,
    RunnerStatusChanged,
)
from events.fold import apply_live
from events.ids import InstanceId, NodeId
from events.runner_detail import exit_detail
from events.stamp import Stamper
from events.state import FINISHED_TASKS_KEPT, State
from events.subjects import WORKER_FAMILIES
from events.vocabulary import JoinCause
from runner.affinity import STARTING_CPUS, can_pin, compute_cpu_env, least_pinned_cpu, pinned_elsewhere
from runner.blas import blas_env
from runner.memory import memory_available_bytes
from runner.models.hub import cached_hub_models
from runner.service.exit_codes import exit_cause
from services.worker.links import LinkSample, measure_links_forever, serve_probes
from services.worker.plan import RunnerKey, host_rank_index, plan_runners, ranks_sharing_host, rejoin_cause
from services.worker.procs import RunnerProcesses, child_env, describe_exit, runner_argv
from services.worker.runner_logs import RUNNER_LOG_BYTES

VERSION = "0.1.0"


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The node's own settings; its runners' come with their instance (`InstancePlaced.settings`)."""

    nats: NatsEndpoint  # the worker's endpoint: URL, TLS files, identity
    runner_nats: NatsEndpoint  # its runners' (handed over in their environment, never argv)
    node_id: str
    host: str = "127.0.0.1"  # the address peers reach this node's ring ports on
    memory_bytes: int = 0  # offered to placement (`node_memory_bytes`); 0 = what the host has available
    link_measure_seconds: float = 300.0  # how often links to the other nodes are measured; 0 = never
    heartbeat_interval_seconds: float
    blas: str
    pin_runner_threads: bool = True
    runner_logs_dir: str = ""  # where each runner's stderr is kept (`runner_logs`); "" = nowhere
    runner_log_bytes: int = RUNNER_LOG_BYTES
    finished_tasks_kept: int = FINISHED_TASKS_KEPT


def default_node_id() -> str:
    return socket.gethostname().split(".")[0] or "node"


class Worker:
    def __init__(self, settings: WorkerSettings, *, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.settings = settings
        self.node_id = NodeId(settings.node_id)
        self.stamper = Stamper(Origin(service="worker", node=settings.node_id), wall_ns=wall_ns)
        self.state = State()
        self._log: EventLog | None = None
        self._cached_models: list[str] = []  # Hub models in this node's cache, read once at start
        self._probe_port = 0  # where peers measure their link to this node (`links.py`)
        self._runners: RunnerProcesses | None = None
        self._first_cpu: int | None = None  # where its ranks' compute CPUs are counted from (`_runner_env`)

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Serve until cancelled; on the way out stop the runners and say the node left."""
        log = await EventLog.connect(self.settings.nats, name=f"shoal-worker-{self.node_id}")
        self._log = log
        try:
            async with asyncio.TaskGroup() as group:
                logs = self.settings.runner_logs_dir
                self._runners = RunnerProcesses(
                    group,
                    self._runner_exited,
                    log_dir=Path(logs) if logs else None,
                    log_bytes=self.settings.runner_log_bytes,
                )
                # catch up before acting: old instances may be retired later in the log. Not from
                # the snapshot, nor every event: a worker may read only what it serves (README
                # "Security"), and nodes and instances are all it decides on.
                self.state = await fold_families(log, WORKER_FAMILIES, self._empty_state())
                self._cached_models = await asyncio.to_thread(cached_hub_models)  # announced as servable
                probes = await asyncio.start_server(serve_probes, self.settings.host, 0)
                self._probe_port = probes.sockets[0].getsockname()[1]
                group.create_task(probes.serve_forever())
                await log.append(self._joined("start"))
                if self.settings.link_measure_seconds > 0:
                    interval = self.settings.link_measure_seconds
                    group.create_task(
                        measure_links_forever(self.node_id, lambda: self.state, self._report_link, interval)
                    )
                group.create_task(self._heartbeats())
                group.create_task(self._announce_on_reconnect(log))
                if ready is not None:
                    ready.set()
                await self._reconcile()
                await follow_families(log, self.state.last_seq + 1, WORKER_FAMILIES, self._on_event)
        finally:
            await self._shutdown(log)

    def _empty_state(self) -> State:
        return State.keeping(self.settings.finished_tasks_kept)

    async def _on_event(self, entry: tuple[int, LogEvent, bytes]) -> None:
        seq, event, subject = entry
        self._fold(seq, event, subject)
        cause = rejoin_cause(self.state, self.node_id, event)
        if cause is not None:
            await self._announce(cause, event_id=f"rejoin-{self.node_id}-{event.env.event_id}")
        await self._reconcile()

    def _fold(self, seq: int, event: LogEvent, subject: bytes) -> None:
        self.state, error = apply_live(self.state, seq, event, subject)
        if error is not None:
            logger.warning("worker {}: skipping seq {}: {}", self.node_id, seq, error)

    async def _reconcile(self) -> None:
        runners = self._runners
        assert runners is not None
        plan = plan_runners(self.state, self.node_id, set(runners.running), runners.ever_started)
        for key in plan.stop:
            await runners.stop(key)
        for key in plan.start:
            await runners.start(
                key, runner_argv(self.settings.nats.url, key, self.settings.node_id), self._runner_env(key)
            )

    def _runner_env(self, key: RunnerKey) -> dict[str, str]:
        sharing = max(1, ranks_sharing_host(self.state, self.settings.host))
        blas = blas_env(self.settings.blas, sharing, os.cpu_count() or 1, os.environ)
        placed: dict[str, str] = {}
        if self.settings.pin_runner_threads:  # runner.affinity: its compute threads share one CPU
            placed = compute_cpu_env(
                host_rank_index(self.state, self.settings.host, key), sharing, self._first_cpu_once()
            )
        return child_env({**blas, **placed, **self.settings.runner_nats.child_env()})  # paths only, never a seed

    def _first_cpu_once(self) -> int | None:
        """The CPU this node's ranks are counted from, chosen at its first runner and kept: the one
        the fewest threads of other programs on this machine are pinned to (another cluster's
        ranks), so independent clusters on one machine spread their compute threads. Every worker
        of this cluster on the host leaves out the same runners (its NATS URL), so they agree."""
        if self._first_cpu is None and can_pin():
            pinned = pinned_elsewhere(self.settings.nats.url)
            self._first_cpu = least_pinned_cpu(STARTING_CPUS, pinned)
            logger.info(
                "worker {}: ranks' compute CPUs counted from CPU {} (pinned elsewhere: {})",
                self.node_id,
                self._first_cpu,
                pinned,
            )
        return self._first_cpu

    async def _runner_exited(self, key: RunnerKey, code: int, stderr_tail: str) -> None:
        assert self._log is not None
        cause = exit_cause(code)
        what = (
            "lost a peer: the ring group broke when another rank went away"
            if cause == "peer_lost"
            else describe_exit(code)
        )
        detail = exit_detail(f"runner process {what}", stderr_tail[-1500:])
        event = RunnerStatusChanged(
            env=self.stamper.stamp(),
            instance_id=InstanceId(key[0]),
            rank=key[1],
            status="failed",
            detail=detail,
            cause=cause,
        )
        await self._log.append(event)

    async def _announce_on_reconnect(self, log: EventLog) -> None:
        seen = 0
        while True:
            seen = await log.reconnected(seen)
            await self._announce("reconnect")

    async def _announce(self, cause: JoinCause, *, event_id: str | None = None) -> None:
        """Say the node is up again. A failure is only logged: if the master times the node out
        meanwhile, folding that timeout announces it once more."""
        assert self._log is not None
        logger.info("worker {}: announcing the node again ({})", self.node_id, cause)
        try:
            await self._log.append(self._joined(cause, event_id))
        except LogError as exc:
            logger.warning("worker {}: could not announce the node ({}): {}", self.node_id, cause, exc)

    def _joined(self, cause: JoinCause, event_id: str | None = None) -> NodeJoined:
        host_memory = memory_available_bytes()  # shared with any other node on this host
        return NodeJoined(
            env=self.stamper.stamp(event_id),
            node_id=self.node_id,
            host=self.settings.host,
            cores=os.cpu_count() or 1,
            memory_bytes=self.settings.memory_bytes or host_memory,
            host_memory_bytes=host_memory,
            cached_models=self._cached_models,
            link_probe_port=self._probe_port,
            backend="cpu" if os.uname().sysname == "Linux" else "metal",
            version=VERSION,
            cause=cause,
            runner_logs=self.settings.runner_logs_dir,
        )

    async def _report_link(self, peer: NodeId, sample: LinkSample) -> None:
        if self._log is None:
            return
        event = LinkMeasured(
            env=self.stamper.stamp(),
            node_id=self.node_id,
            peer=peer,
            rtt_us=sample.rtt_us,
            bytes_per_second=sample.bytes_per_second,
        )
        try:
            await self._log.append(event)
        except LogError as exc:
            logger.warning("worker {}: could not record the link to {}: {}", self.node_id, peer, exc)

    async def _heartbeats(self) -> None:
        assert self._log is not None and self._runners is not None
        while True:
            beat = NodeHeartbeat(
                env=self.stamper.stamp(),
                node_id=self.node_id,
                free_memory_bytes=memory_available_bytes(),
                runners=len(self._runners.running),
            )
            try:
                await self._log.publish_telemetry(beat)
            except Exception as exc:  # a missed beat is what the master's timeout is for
                logger.warning("heartbeat not sent: {}", exc)
            await asyncio.sleep(self.settings.heartbeat_interval_seconds)

    async def _shutdown(self, log: EventLog) -> None:
        if self._runners is not None:
            await self._runners.stop_all()
        try:
            await asyncio.wait_for(
                log.append(NodeLeft(env=self.stamper.stamp(), node_id=self.node_id, reason="shutdown")), 3
            )
        except TimeoutError:
            logger.warning("could not announce that node {} left: the log did not acknowledge within 3s", self.node_id)
        except Exception as exc:
            logger.warning("could not announce that node {} left: {}", self.node_id, exc)
        try:
            await log.close()
        except (OSError, ConnectionError) as exc:  # the server may already be gone at shutdown
            logger.debug("closing the log connection: {}", exc)
