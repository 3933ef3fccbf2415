"""`shoal up`: embedded NATS (unless a URL is given), the master, N workers and the API in one
process tree, each service supervised (restarted with backoff when it fails, while the others
keep serving: `services/supervise.py`); a ready line once a warm instance of the model exists,
saying whether the API is open or needs keys; Ctrl-C stops it all. The API's keys are read (and an open API on a network
refused) before anything starts.

The embedded server admits only the identities `shoal up` keeps under `<data_dir>/nats-credentials`
(made on the first run, reused after): each service connects as itself, and the admin identity
creates the streams before any service starts (README "Security"). It answers join requests
too: a machine given a token (`shoal nats token create`) joins as a worker (`services/join_desk.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

import msgspec

from eventlog.log import EventLog
from events.catalogue import ClusterStarted, Origin
from events.fold import apply_live
from events.origins import UP
from events.stamp import Stamper
from events.state import InstanceInfo, State
from runner.heap import settle_heap
from services.api.auth import ApiAccess, load_api_access
from services.config import ConfigError, ResolvedConfig, log_settings
from services.credentials import CredentialsError, embedded_server, endpoint_for
from services.join_desk import JoinDesk
from services.nats import EmbeddedNats
from services.nats_keeper import keep_running
from services.nats_permissions import Identity
from services.roles import Service, run_api, run_master, run_worker
from services.stop_signals import until_stopped
from services.supervise import supervise
from services.up_progress import UpProgress

NODE_PREFIX = "node"


def node_ids(workers: int) -> list[str]:
    return [f"{NODE_PREFIX}-{i}" for i in range(workers)]


async def wait_until_ready(log: EventLog, model: str) -> str:
    """Follow the log until an instance of `model` has every rank ready; its id. Prints download
    progress and why the model cannot be served (refused after failed loads included), as the log
    tells them. Readiness is judged from the log's current end on: an instance that was ready in
    an earlier run and is not retired yet is history the master is about to retire, not this run's
    ready line."""
    state = await log.fold()
    progress = UpProgress(model)
    if instance := _ready_instance(state, progress):
        return instance
    async for seq, event, subject in log.deliveries(state.last_seq + 1):
        state, _error = apply_live(state, seq, event, subject)
        if instance := _ready_instance(state, progress):
            return instance
    raise RuntimeError("the event log ended before an instance was ready")


def _ready_instance(state: State, progress: UpProgress) -> str:
    for line in progress.lines(state):
        print(line, flush=True)
    ready = [i for i in state.instances.values() if i.model == progress.model and i.ready and _nodes_up(state, i)]
    return ready[0].instance_id if ready else ""


def _nodes_up(state: State, instance: InstanceInfo) -> bool:
    return all((node := state.nodes.get(s.node_id)) is not None and node.status == "up" for s in instance.shards)


def cluster_services(resolved: ResolvedConfig, access: ApiAccess, workers: int) -> list[Service]:
    """Every service `shoal up` runs, in start order; one with `wait` is ready before the next starts
    (the master has reconciled before workers join; the API listens before the ready line)."""
    masters = resolved.config.masters  # one leads by the lease; the others stand by
    services = [
        Service(name, functools.partial(run_master, resolved, place_after_nodes=workers, name=name))
        for name in (f"master-{index}" for index in range(masters))
    ]
    for node_id in node_ids(workers):
        services.append(Service(f"worker {node_id}", functools.partial(run_worker, resolved, node_id), wait=False))
    services.append(Service("API", functools.partial(run_api, resolved, access)))
    return services


async def run_cluster(
    resolved: ResolvedConfig, access: ApiAccess, workers: int, embedded: EmbeddedNats | None = None
) -> None:
    """Every service of `shoal up`, supervised, and `embedded` (the server `shoal up` started)
    kept running: started again if it exits."""
    config = resolved.config
    admin = endpoint_for(config, Identity("admin"))
    log = await EventLog.connect(admin, log_settings(config), name="shoal-up")
    try:
        # The log outlives this run: mark where it begins, so `shoal diagnose` tells now from before.
        started = ClusterStarted(
            env=Stamper(Origin(service=UP)).stamp(), workers=workers, model=", ".join(config.models)
        )
        await log.append(started)
        async with _fatal_unwrapped(), asyncio.TaskGroup() as group:
            if embedded is not None:
                group.create_task(supervise("embedded NATS", functools.partial(keep_running, embedded)))
                desk = JoinDesk(
                    directory=Path(config.nats_credentials_dir),
                    store_dir=embedded.store_dir,
                    ca_file=config.nats_tls_ca,
                    clock=time.time,
                )
                group.create_task(supervise("join desk", functools.partial(desk.serve, admin)))
            for service in cluster_services(resolved, access, workers):
                ready = asyncio.Event()
                run = functools.partial(service.run, ready=ready)
                group.create_task(supervise(service.name, run, fatal=FATAL))
                if service.wait:
                    await ready.wait()
            url = f"http://{config.api_host}:{config.api_port}"
            first, *others = config.models
            models = ", ".join(repr(m) for m in config.models)
            print(f"shoal: API at {url}/v1 (models {models}, {workers} worker(s)); warming up...", flush=True)
            instance = await wait_until_ready(log, first)
            settle_heap()  # what the API and the model's tokenizer loaded, out of full collections' way
            print(
                f"shoal: ready: instance {instance} serves {first!r} at {url}/v1; {access.describe()}",
                flush=True,
            )
            if others:
                print("shoal: the other models are placed as they fit; `shoal models ls` shows each", flush=True)
    finally:
        await log.close()


# A setting no restart cures (a port in use, an unusable identity): it ends `shoal up`, which
# stops every service and says what to fix, as `shoal master|worker|api` do.
FATAL: tuple[type[Exception], ...] = (ConfigError, CredentialsError)


@contextlib.asynccontextmanager
async def _fatal_unwrapped() -> AsyncGenerator[None]:
    """A fatal error out of the services' task group, raised alone (the caller prints it)."""
    try:
        yield
    except BaseExceptionGroup as failed:
        fatal = failed.subgroup(FATAL)
        if fatal is None:
            raise
        first: BaseException = fatal
        while isinstance(first, BaseExceptionGroup):
            first = cast("BaseException", first.exceptions[0])
        raise first from None


def up(resolved: ResolvedConfig, workers: int, *, insecure_plaintext: bool = False) -> int:
    config = resolved.config
    access = load_api_access(resolved)
    nats: EmbeddedNats | None = None
    if not config.nats_url:
        nats, directory = embedded_server(config, node_ids(workers), insecure_plaintext=insecure_plaintext)
        nats.start()
        print(f"shoal: NATS at {nats.url} admits only the identities in {directory}", flush=True)
        resolved = _with_embedded_nats(resolved, nats.url, str(directory))
    try:
        return asyncio.run(_main(resolved, access, workers, nats))
    finally:
        if nats is not None:
            nats.stop()


async def _main(resolved: ResolvedConfig, access: ApiAccess, workers: int, embedded: EmbeddedNats | None) -> int:
    await until_stopped(run_cluster(resolved, access, workers, embedded))
    print("shoal: stopped", file=sys.stderr, flush=True)
    return 0


def _with_embedded_nats(resolved: ResolvedConfig, url: str, credentials: str) -> ResolvedConfig:
    """The config the services get: the embedded server's address and the identities it admits."""
    config = msgspec.structs.replace(resolved.config, nats_url=url, nats_credentials_dir=credentials)
    sources = {
        **resolved.sources,
        "nats_url": f"embedded nats-server ({resolved.sources.get('nats_port', 'default')} port)",
        "nats_credentials_dir": f"embedded nats-server ({resolved.sources['nats_credentials_dir']})",
    }
    return msgspec.structs.replace(resolved, config=config, sources=sources)
