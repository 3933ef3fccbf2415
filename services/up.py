"""`shoal up`: embedded NATS (unless a URL is given), the master, N workers and the API in one
process tree; a ready line once a warm instance of the model exists; Ctrl-C stops it all."""

from __future__ import annotations

import asyncio
import signal
import sys

from eventlog.log import EventLog
from events.fold import apply_live
from events.state import State
from services.config import ResolvedConfig
from services.nats import EmbeddedNats
from services.roles import run_api, run_master, run_worker

NODE_PREFIX = "node"


async def wait_until_ready(url: str, model: str) -> str:
    """Follow the log until an instance of `model` has every rank ready; its id."""
    log = await EventLog.connect(url, name="shoal-up")
    state = State()
    try:
        async for seq, event in log.follow(from_seq=1):
            state, _error = apply_live(state, seq, event)
            for instance in state.instances.values():
                if instance.model == model and instance.ready:
                    return instance.instance_id
    finally:
        await log.close()
    raise RuntimeError("the event log ended before an instance was ready")


async def run_cluster(resolved: ResolvedConfig, workers: int) -> None:
    config = resolved.config
    async with asyncio.TaskGroup() as group:
        master_ready = asyncio.Event()
        group.create_task(run_master(resolved, min_nodes_for_default=workers, ready=master_ready))
        await master_ready.wait()
        for i in range(workers):
            group.create_task(run_worker(resolved, f"{NODE_PREFIX}-{i}"))
        api_ready = asyncio.Event()
        group.create_task(run_api(resolved, api_ready))
        await api_ready.wait()
        url = f"http://{config.api_host}:{config.api_port}"
        print(f"shoal: API at {url}/v1 (model {config.model!r}, {workers} worker(s)); warming up...", flush=True)
        instance = await wait_until_ready(config.client_nats_url, config.model)
        print(f"shoal: ready: instance {instance} serves {config.model!r} at {url}/v1", flush=True)


def up(resolved: ResolvedConfig, workers: int) -> int:
    config = resolved.config
    nats: EmbeddedNats | None = None
    if not config.nats_url:
        nats = EmbeddedNats(data_dir=config.data_path, host=config.nats_host, port=config.nats_port).start()
        resolved = _with_nats_url(resolved, nats.url)
    try:
        return asyncio.run(_main(resolved, workers))
    finally:
        if nats is not None:
            nats.stop()


async def _main(resolved: ResolvedConfig, workers: int) -> int:
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main.cancel)
    try:
        await run_cluster(resolved, workers)
    except asyncio.CancelledError:
        print("shoal: stopped", file=sys.stderr, flush=True)
        return 0
    return 0


def _with_nats_url(resolved: ResolvedConfig, url: str) -> ResolvedConfig:
    import msgspec

    config = msgspec.structs.replace(resolved.config, nats_url=url)
    sources = {
        **resolved.sources,
        "nats_url": f"embedded nats-server ({resolved.sources.get('nats_port', 'default')} port)",
    }
    return msgspec.structs.replace(resolved, config=config, sources=sources)
