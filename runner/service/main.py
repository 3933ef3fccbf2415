"""`python -m runner.service.main --nats-url URL --instance ID --rank R --node-id N`: one rank of an instance.

Spawned by the worker. The command line says only who the rank is; everything else, settings
included (`InstancePlaced.settings`), comes from its placement in the log. Reads it, starts its
heartbeats, joins the ring group, loads its shard, warms up, reports `ready`, then serves
assignments until SIGTERM. Any error that breaks the group ends the process with a `TaskFailed`
for the running task and a `failed` status; the worker reports the exit, the master retires the
instance.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import nats.errors
from loguru import logger

from eventlog.endpoint import NatsEndpoint
from events.catalogue import AnyEvent, InstancePlaced, Origin, TaskCreated, TaskFailed
from events.ids import InstanceId, NodeId
from events.runner_settings import RunnerSettings
from events.stamp import Stamper
from events.subjects import instance_subject
from events.vocabulary import RunnerStatus, RunnerStatusCause
from runner.affinity import pin_compute_threads
from runner.blas import BlasThreads
from runner.engine.protocols import PhaseTracker
from runner.flight.faults import FaultInjector
from runner.heap import settle_heap
from runner.ring_init import init_ring
from runner.ring_wait import RingInbound
from runner.service.bridge import LogBridge, LogBridgeDown
from runner.service.exit_codes import PEER_LOST_EXIT, is_peer_loss
from runner.service.heartbeats import LogHeartbeats, RunningTasks
from runner.service.orphan import ExitWithParent
from runner.service.sink import LogSink
from runner.service.tasks import TaskServer

if TYPE_CHECKING:
    import mlx.core as mx

    from runner.engine.batch import ContinuousBatch
    from runner.engine.engine import Engine
    from runner.engine.requests import GenerationRequest
    from runner.flight.recorder import FlightRecorder


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="runner.service.main")
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--node-id", default="")
    return parser.parse_args(argv)


def write_hostfile(ring_hosts: list[str]) -> Path:
    handle, name = tempfile.mkstemp(prefix="shoal-ring-", suffix=".json")
    with os.fdopen(handle, "w") as f:
        json.dump([[host] for host in ring_hosts], f)
    return Path(name)


def join_group(placed: InstancePlaced, rank: int) -> mx.distributed.Group | None:
    """The ring group of this instance (None for one rank)."""
    if len(placed.shards) == 1:
        return None
    hostfile = write_hostfile(list(placed.ring_hosts))
    os.environ["MLX_RANK"] = str(rank)
    os.environ["MLX_HOSTFILE"] = str(hostfile)
    try:
        return init_ring(rank, len(placed.shards))
    except RuntimeError as exc:
        raise RuntimeError(ring_failure(str(exc), list(placed.ring_hosts), rank)) from exc
    finally:
        hostfile.unlink(missing_ok=True)


def placement_identity(placed: InstancePlaced) -> str:
    """What every rank of this placement, and no rank of another cluster's, knows: an instance id
    and ring ports repeat across clusters (a second `shoal up` on the host), the master's clock at
    the placement does not."""
    return f"{placed.instance_id}@{placed.env.wall_time}:{','.join(placed.ring_hosts)}"


def ring_failure(error: str, ring_hosts: list[str], rank: int) -> str:
    """mlx's ring error, with what to do when it is this rank's own port that is taken."""
    if "Couldn't bind socket" not in error:
        return error
    return (
        f"{error}: ring port {ring_hosts[rank]} of rank {rank} is held by another program on this host "
        "(the master's next placement takes other ports; a cluster that keeps meeting one should set "
        "ring_base_port to a range of its own)"
    )


def make_request_factory() -> Callable[[str, list[int], TaskCreated], GenerationRequest]:
    from runner.engine.requests import GenerationRequest

    def make(task_id: str, prompt: list[int], created: TaskCreated) -> GenerationRequest:
        return GenerationRequest.of_task(task_id, prompt, created.params, created.owner)

    return make


# How long a rank keeps asking for its placement while NATS cannot answer (a server restarting, an
# election: JetStream says 503 "temporarily unavailable" for seconds). Past it the rank fails; the
# master's loading deadline bounds the whole start anyway.
PLACEMENT_FETCH_SECONDS = 60.0
PLACEMENT_RETRY_MAX_SECONDS = 5.0


class PlacementSource(Protocol):
    def fetch_entry(self, subject: str, timeout: float = 10.0) -> tuple[int, AnyEvent] | None: ...


def fetch_placement(
    bridge: PlacementSource,
    instance_id: str,
    stop: threading.Event,
    *,
    patience_s: float = PLACEMENT_FETCH_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, InstancePlaced]:
    """The instance's `InstancePlaced` and its sequence number: where the rank learns everything.
    A NATS that cannot answer yet is asked again (0.5 s, doubling to 5 s) for `patience_s`, or
    until the rank is stopped: a transient outage as the rank starts must not cost the instance."""
    deadline = clock() + patience_s
    delay = 0.5
    while True:
        try:
            found = bridge.fetch_entry(instance_subject(instance_id, "placed"))
            break
        except (TimeoutError, nats.errors.Error) as exc:
            if clock() + delay > deadline or stop.is_set():
                raise
            logger.warning("cannot read the placement of {} yet ({}): asking again in {}s", instance_id, exc, delay)
            stop.wait(delay)
            delay = min(2 * delay, PLACEMENT_RETRY_MAX_SECONDS)
    if found is None or not isinstance(found[1], InstancePlaced):
        raise RuntimeError(f"instance {instance_id} has no InstancePlaced in the log")
    return found[0], found[1]


def run(
    args: argparse.Namespace,
    placed_seq: int,
    placed: InstancePlaced,
    bridge: LogBridge,
    stamper: Stamper,
    phases: PhaseTracker,
    stop: threading.Event,
    running: RunningTasks,
) -> None:
    # Loading from here: importing the engine (MLX, mlx-lm, transformers) takes seconds on a busy
    # host, and a heartbeat that says "idle" meanwhile reads as a rank stuck doing nothing.
    phases.enter("loading")
    from runner.engine.alone import warm_up
    from runner.engine.collectives import Collectives
    from runner.engine.engine import Engine
    from runner.engine.shard import ShardPlacement
    from runner.models.resolve import resolve_model
    from runner.shard_loading import load_shard

    server_status = _status_publisher(bridge, stamper, args)
    server_status("loading")
    faults = FaultInjector.from_env(args.rank)
    faults.loading()
    ranges = tuple((s.start_layer, s.end_layer) for s in sorted(placed.shards, key=lambda s: s.rank))
    model_dir = resolve_model(
        placed.model,
        allow_download=placed.settings.model_download,
        progress=_download_reporter(bridge, stamper, args.node_id, placed.model),
    )
    group = join_group(placed, args.rank)
    inbound = None if group is None else RingInbound.find(list(placed.ring_hosts), args.rank)
    if inbound is not None and inbound.found == 0:
        logger.warning(
            "the inbound ring socket was not found among the process's descriptors: waits for a peer will spin"
        )
    Collectives(group, inbound).check_members(placement_identity(placed))  # before loading: fail fast
    shard = load_shard(model_dir, ShardPlacement(args.rank, len(ranges), ranges), group, inbound)
    engine = Engine(group, shard, placed.settings, ranks_on_host(list(placed.ring_hosts), args.rank))
    server_status("warming_up")
    warm_up(engine, phases)  # a batch of one through the batch loop (`runner.engine.alone`)
    bridge.watch(args.instance, placed_seq + 1)
    server = TaskServer(
        engine=engine,
        inbox=bridge,
        cancel=faults.around(bridge),
        sink=LogSink(bridge, stamper, args.rank),
        stamper=stamper,
        phases=phases,
        instance_id=InstanceId(args.instance),
        rank=args.rank,
        is_sampling_rank=engine.is_sampling_rank,
        make_request=make_request_factory(),
        batch=continuous_batch(engine, phases),
        running=running,
    )
    settle_heap()  # the model and its libraries stay loaded: a full collection mid-decode skips them
    server.status("ready")
    try:
        server.serve(stop)
    except Exception as exc:
        if not is_peer_loss(exc) and not isinstance(exc, LogBridgeDown):
            error = f"rank {args.rank} failed: {type(exc).__name__}: {exc}"
            for task_id in server.running:
                bridge.publish(TaskFailed(env=stamper.stamp(), task_id=task_id, error=error, rank=args.rank))
        raise


def ranks_on_host(ring_hosts: list[str], rank: int) -> int:
    """How many of the instance's ranks run on `rank`'s machine (its ring address's host)."""
    host = ring_hosts[rank].rsplit(":", 1)[0]
    return sum(1 for address in ring_hosts if address.rsplit(":", 1)[0] == host)


def continuous_batch(engine: Engine, phases: PhaseTracker) -> ContinuousBatch:
    """The instance's batch, which serves every task (`max_batch` 1: a batch of one). The settings
    are the instance's, so every rank builds the same one."""
    from runner.engine.batch import ContinuousBatch
    from runner.engine.batch_warmup import warm_pace
    from runner.engine.shared_cores import agreed_cores
    from runner.preparer import ThreadedPreparer

    settings = engine.settings
    engine.calibrate_prefill()  # every rank: the chunks' exchange rate, measured (`calibration`)
    cores = agreed_cores(engine, os.environ)  # every rank: the decode mode of ranks sharing a machine
    mode = "in lockstep" if cores.lockstep else "on the ring" if engine.collectives.world > 1 else "alone"
    logger.info(
        "rank {}: decodes {}; BLAS threads {} (ranks at work at once) or {}",
        engine.rank,
        mode,
        cores.blas.share,
        cores.blas.every,
    )
    preparer = ThreadedPreparer(engine.prepare)
    batch = ContinuousBatch(engine, phases, settings.max_batch, settings.prefix_cache_bytes, preparer, cores)
    warm_pace(batch)  # every rank, before serving: the first long prompt beside streams leaves them room
    return batch


# Seconds between two download reports of a rank: often enough for a progress line, rare
# enough that a large model's download adds only a few hundred events to the log.
DOWNLOAD_REPORT_SECONDS = 2.0


def _download_reporter(bridge: LogBridge, stamper: Stamper, node_id: str, model: str) -> Callable[[int, int], None]:
    """Publishes a Hub download's byte progress, at most every DOWNLOAD_REPORT_SECONDS and once
    when it completes (huggingface_hub calls it from its download threads; `publish` is thread-safe)."""
    from events.catalogue import ModelDownloadProgress
    from runner.models.hub import ProgressThrottle

    throttle = ProgressThrottle(DOWNLOAD_REPORT_SECONDS)

    def report(done: int, total: int) -> None:
        if throttle.due(done, total):
            event = ModelDownloadProgress(
                env=stamper.stamp(), node_id=NodeId(node_id), model=model, bytes_done=done, bytes_total=total
            )
            bridge.publish(event)

    return report


def _status_publisher(bridge: LogBridge, stamper: Stamper, args: argparse.Namespace) -> Callable[..., None]:
    from events.catalogue import RunnerStatusChanged

    def publish(status: RunnerStatus, detail: str = "", cause: RunnerStatusCause | None = None) -> None:
        bridge.publish(
            RunnerStatusChanged(
                env=stamper.stamp(),
                instance_id=InstanceId(args.instance),
                rank=args.rank,
                status=status,
                detail=detail,
                cause=cause,
            )
        )

    return publish


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _, placed_on = pin_compute_threads(os.environ)  # first: every thread started after inherits it
    BlasThreads.at_share(os.environ)  # a batch takes every core for its lockstep steps (`shared_cores.py`)
    logger.info("rank {} of {}: {}", args.rank, args.instance, placed_on)
    orphan = ExitWithParent()
    orphan.start()
    stamper = Stamper(Origin(service="runner", node=args.node_id, rank=args.rank))
    phases = PhaseTracker()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    bridge = LogBridge(NatsEndpoint.from_env(args.nats_url, os.environ), stamper)  # TLS files: see NatsEndpoint
    bridge.start()
    orphan.before_exit(_last_words(bridge, stamper, args, orphan.parent))
    try:
        placed_seq, placed = fetch_placement(bridge, args.instance, stop)
        bridge.limit_backlog(placed.settings.publish_backlog_events)
        running = RunningTasks()
        with _flight_recorder(args, placed.settings, bridge, phases, running):
            run(args, placed_seq, placed, bridge, stamper, phases, stop, running)
    except Exception as exc:
        if is_peer_loss(exc):
            logger.error("rank {} of {} lost a peer: {}", args.rank, args.instance, exc)
            bridge.close()
            return PEER_LOST_EXIT  # the worker reports it; the master waits to name the rank that died
        logger.error("rank {} of {} failed: {}", args.rank, args.instance, exc)
        traceback.print_exc()
        if not isinstance(exc, LogBridgeDown):  # a bridge that is down carries no report: the worker's will
            _status_publisher(bridge, stamper, args)("failed", f"{type(exc).__name__}: {exc}"[:500], "error")
        bridge.close()
        return 1
    _status_publisher(bridge, stamper, args)("stopped", "SIGTERM", "terminated")
    bridge.close()
    return 0


def _last_words(
    bridge: LogBridge, stamper: Stamper, args: argparse.Namespace, worker_pid: int
) -> Callable[[float], None]:
    """An orphaned rank's report of its own going down (its worker, who reports exits, is gone),
    queued after everything it made, then the queue handed over within `seconds`."""

    def speak(seconds: float) -> None:
        detail = f"its worker (pid {worker_pid}) died, so the runner exited with it"
        _status_publisher(bridge, stamper, args)("failed", detail, "exited")
        bridge.close(timeout=seconds)

    return speak


def _flight_recorder(
    args: argparse.Namespace, settings: RunnerSettings, bridge: LogBridge, phases: PhaseTracker, running: RunningTasks
) -> FlightRecorder:
    """The flight recorder (docs/ARCHITECTURE.md §7), publishing RunnerHeartbeat to telemetry."""
    from runner.flight.recorder import FlightRecorder

    stamper = Stamper(Origin(service="runner", node=args.node_id, rank=args.rank))
    return FlightRecorder(
        phases,
        LogHeartbeats(stamper, bridge.publish, instance_id=args.instance, rank=args.rank, running=running),
        rank=args.rank,
        interval_s=settings.heartbeat_interval_seconds,
        stall_stack_seconds=settings.stall_stack_seconds,
    )


if __name__ == "__main__":
    sys.exit(main())
