"""The cluster's roles built from one resolved config, so `shoal up` and the standalone
`shoal master|worker|api` commands run exactly the same services with the same settings, each
under its own identity on the bus (`services/credentials.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol

import msgspec

from runner.heap import settle_heap
from services.api.app import serve_api
from services.api.auth import ApiAccess
from services.config import ResolvedConfig, ShoalConfig, runner_settings
from services.credentials import endpoint_for
from services.master.core import MasterPolicy
from services.master.placement import NodeCount
from services.master.service import Master, MasterSettings
from services.models import LocalModelCatalog
from services.nats_permissions import Identity
from services.worker.runner_logs import runner_logs_dir
from services.worker.service import Worker, WorkerSettings


class RunService(Protocol):
    def __call__(self, *, ready: asyncio.Event) -> Awaitable[None]:
        """Run the service until cancelled, setting `ready` once it serves."""
        ...


class Service(msgspec.Struct, frozen=True):
    """One service of a cluster, as `shoal up` starts and supervises it."""

    name: str  # for the log lines that say it failed and restarts
    run: RunService
    wait: bool = True  # start the next service only once this one is ready


def master_policy(config: ShoalConfig, *, place_after_nodes: int = 1) -> MasterPolicy:
    return MasterPolicy(
        runner_settings=runner_settings(config),
        models=config.models,
        place_after_nodes=place_after_nodes,
        nodes_per_instance=NodeCount(least=config.min_nodes_per_instance),
        model_keep_alive_seconds=config.model_keep_alive_seconds,
        max_instances_per_model=config.max_instances_per_model,
        replica_after_wait_seconds=config.replica_after_wait_seconds,
        task_stall_seconds=config.task_stall_seconds,
        node_timeout_seconds=config.node_timeout_seconds,
        request_timeout_seconds=config.request_timeout_seconds,
        ring_base_port=config.ring_base_port,
        instance_ready_timeout_seconds=config.instance_ready_timeout_seconds,
    )


def served(config: ShoalConfig) -> list[str]:
    return list(config.models)


async def run_master(
    resolved: ResolvedConfig,
    *,
    place_after_nodes: int = 1,
    ready: asyncio.Event | None = None,
    name: str | None = None,  # the lease holder's name (default: host and pid)
) -> None:
    config = resolved.config
    settings = MasterSettings(
        nats=endpoint_for(config, Identity("master")),
        policy=master_policy(config, place_after_nodes=place_after_nodes),
        master_lease_seconds=config.master_lease_seconds,
        finished_tasks_kept=config.finished_tasks_kept,
        snapshot_every_events=config.snapshot_every_events,
    )
    if name is not None:
        settings = msgspec.structs.replace(settings, name=name)
    await Master(settings, LocalModelCatalog(allow_download=config.model_download)).run(ready)


def worker_settings(config: ShoalConfig, node_id: str, *, host: str = "127.0.0.1") -> WorkerSettings:
    return WorkerSettings(
        nats=endpoint_for(config, Identity("worker", node_id)),
        runner_nats=endpoint_for(config, Identity("runner", node_id)),
        node_id=node_id,
        host=host,
        memory_bytes=config.node_memory_bytes,
        link_measure_seconds=config.link_measure_seconds,
        heartbeat_interval_seconds=config.heartbeat_interval_seconds,
        blas=config.blas,
        pin_runner_threads=config.pin_runner_threads,
        runner_logs_dir=str(runner_logs_dir(config.data_path.absolute(), node_id)),
        runner_log_bytes=config.runner_log_bytes,
        finished_tasks_kept=config.finished_tasks_kept,
    )


async def run_worker(
    resolved: ResolvedConfig,
    node_id: str,
    *,
    host: str = "127.0.0.1",
    ready: asyncio.Event | None = None,
) -> None:
    settings = worker_settings(resolved.config, node_id, host=host)
    await Worker(settings).run(ready)


async def run_api(resolved: ResolvedConfig, access: ApiAccess, ready: asyncio.Event | None = None) -> None:
    config = resolved.config
    await serve_api(resolved, access, served(config), endpoint_for(config, Identity("api")), ready)


async def run_api_process(resolved: ResolvedConfig, access: ApiAccess) -> None:
    """`shoal api`: the API, whose process freezes its heap once it listens (`runner/heap.py`).
    The garbage collector is the process's, so the command settles it, not `run_api`: a process
    that runs an API among other things (`shoal up`, a test) decides for itself."""
    ready = asyncio.Event()

    async def settle_when_listening() -> None:
        await ready.wait()
        settle_heap()

    settling = asyncio.create_task(settle_when_listening())
    try:  # not a task group: the API's own error (a port in use: `ConfigError`) goes out unwrapped
        await run_api(resolved, access, ready)
    finally:
        settling.cancel()
