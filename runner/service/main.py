"""`python -m runner.service.main --nats-url URL --instance ID --rank R`: one rank of an instance.

Spawned by the worker. Reads its placement from the log, joins the ring group, loads its
shard, warms up, reports `ready`, then serves assignments until SIGTERM. Any error that breaks
the group ends the process with a `TaskFailed` for the running task and a `failed` status; the
worker reports the exit, the master retires the instance.
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
from pathlib import Path
from typing import Any

from loguru import logger

from events.catalogue import InstancePlaced, Origin, TaskCreated, TaskFailed
from events.ids import InstanceId, TaskId
from events.stamp import Stamper
from events.subjects import instance_subject
from runner.engine.protocols import CancelSource, PhaseTracker
from runner.flight.faults import FAULT_ENV, FaultyCancel, parse_fault
from runner.service.bridge import LogBridge, LogBridgeDown
from runner.service.exit_codes import PEER_LOST_EXIT, is_peer_loss
from runner.service.sink import LogSink
from runner.service.tasks import TaskServer


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="runner.service.main")
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--node-id", default="")
    parser.add_argument("--decode-cancel-poll-tokens", type=int, default=8)
    parser.add_argument("--heartbeat-seconds", type=float, default=1.0)
    parser.add_argument("--stall-stack-seconds", type=float, default=5.0)
    return parser.parse_args(argv)


def write_hostfile(ring_hosts: list[str]) -> Path:
    handle, name = tempfile.mkstemp(prefix="shoal-ring-", suffix=".json")
    with os.fdopen(handle, "w") as f:
        json.dump([[host] for host in ring_hosts], f)
    return Path(name)


def join_group(placed: InstancePlaced, rank: int) -> Any:
    """The ring group of this instance (None for one rank)."""
    import mlx.core as mx

    if len(placed.shards) == 1:
        return None
    hostfile = write_hostfile(list(placed.ring_hosts))
    os.environ["MLX_RANK"] = str(rank)
    os.environ["MLX_HOSTFILE"] = str(hostfile)
    try:
        return mx.distributed.init(backend="ring", strict=True)
    finally:
        hostfile.unlink(missing_ok=True)


def make_request_factory() -> Any:
    from runner.engine.engine import GenerationRequest

    def make(task_id: str, prompt: list[int], created: TaskCreated) -> GenerationRequest:
        p = created.params
        return GenerationRequest(
            task_id=task_id,
            prompt_token_ids=prompt,
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            stop=list(p.stop),
        )

    return make


def run(
    args: argparse.Namespace, bridge: LogBridge, stamper: Stamper, phases: PhaseTracker, stop: threading.Event
) -> None:
    from runner.engine.engine import Engine, EngineSettings
    from runner.models.shard import ShardPlacement, load_shard
    from runner.models.tiny import resolve_model

    found = bridge.fetch_entry(instance_subject(args.instance, "placed"))
    if found is None or not isinstance(found[1], InstancePlaced):
        raise RuntimeError(f"instance {args.instance} has no InstancePlaced in the log")
    placed_seq, placed = found[0], found[1]
    server_status = _status_publisher(bridge, stamper, args)
    server_status("loading")
    phases.enter("loading")
    ranges = tuple((s.start_layer, s.end_layer) for s in sorted(placed.shards, key=lambda s: s.rank))
    group = join_group(placed, args.rank)
    shard = load_shard(resolve_model(placed.model), ShardPlacement(args.rank, len(ranges), ranges), group)
    settings = EngineSettings(
        prefill_step_size=placed.prefill_step_size,
        kv_bits=placed.kv_bits,
        kv_group_size=placed.kv_group_size,
        decode_cancel_interval=args.decode_cancel_poll_tokens,
    )
    engine = Engine(group, shard, settings)
    server_status("warming_up")
    engine.warm_up(phases)
    bridge.watch(args.instance, placed_seq + 1)
    fault = parse_fault(os.environ.get(FAULT_ENV))
    cancel: CancelSource = bridge if fault is None or fault.rank != args.rank else FaultyCancel(bridge, fault)
    server = TaskServer(
        engine=engine,
        inbox=bridge,
        cancel=cancel,
        sink=LogSink(bridge, stamper, args.rank),
        stamper=stamper,
        phases=phases,
        instance_id=InstanceId(args.instance),
        rank=args.rank,
        is_sampling_rank=engine.is_sampling_rank,
        make_request=make_request_factory(),
    )
    server.status("ready")
    try:
        server.serve(stop)
    except Exception as exc:
        if server.current is not None and not is_peer_loss(exc) and not isinstance(exc, LogBridgeDown):
            error = f"rank {args.rank} failed: {type(exc).__name__}: {exc}"
            bridge.publish(TaskFailed(env=stamper.stamp(), task_id=TaskId(server.current), error=error, rank=args.rank))
        raise


def _status_publisher(bridge: LogBridge, stamper: Stamper, args: argparse.Namespace) -> Any:
    from events.catalogue import RunnerStatusChanged

    def publish(status: Any, detail: str = "") -> None:
        bridge.publish(
            RunnerStatusChanged(
                env=stamper.stamp(), instance_id=InstanceId(args.instance), rank=args.rank, status=status, detail=detail
            )
        )

    return publish


def exit_with_parent(poll_seconds: float = 1.0) -> threading.Thread:
    """A runner whose worker died (even by SIGKILL) exits too, instead of holding its ports."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:
                os._exit(3)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    exit_with_parent()
    stamper = Stamper(Origin(service="runner", node=args.node_id, rank=args.rank))
    phases = PhaseTracker()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    bridge = LogBridge(args.nats_url)
    bridge.start()
    try:
        with _flight_recorder(args, bridge, phases):
            run(args, bridge, stamper, phases, stop)
    except Exception as exc:
        if is_peer_loss(exc):
            logger.error("rank {} of {} lost a peer: {}", args.rank, args.instance, exc)
            bridge.close()
            return PEER_LOST_EXIT  # the worker reports it; the master waits to name the rank that died
        logger.error("rank {} of {} failed: {}", args.rank, args.instance, exc)
        traceback.print_exc()
        if not isinstance(exc, LogBridgeDown):  # a bridge that is down carries no report: the worker's will
            _status_publisher(bridge, stamper, args)("failed", f"{type(exc).__name__}: {exc}"[:500])
        bridge.close()
        return 1
    _status_publisher(bridge, stamper, args)("stopped", "SIGTERM")
    bridge.close()
    return 0


def _flight_recorder(args: argparse.Namespace, bridge: LogBridge, phases: PhaseTracker) -> Any:
    """The heartbeat thread (DESIGN.md §3), publishing RunnerHeartbeat to telemetry."""
    from runner.flight.recorder import HeartbeatThread

    stamper = Stamper(Origin(service="runner", node=args.node_id, rank=args.rank))
    return HeartbeatThread(
        phases,
        stamper,
        bridge.publish,
        instance_id=args.instance,
        rank=args.rank,
        interval_s=args.heartbeat_seconds,
        stall_stack_seconds=args.stall_stack_seconds,
    )


if __name__ == "__main__":
    sys.exit(main())
