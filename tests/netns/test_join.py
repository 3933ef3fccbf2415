"""A machine joins with a token, as the README's "Adding a machine" has a new user type it, across
network namespaces: a `control` host runs `shoal nats` (mutual TLS, certificates from `shoal nats
certs`), `shoal master` and `shoal api`; a fresh host `w0` holds no seed and no CA, only its own
TLS client certificate, and runs `shoal worker --join tls://control:4222 --token T`. It serves a
request; revoked mid-stream (`shoal nats revoke-node w0`), it is cut off, its task fails with a
diagnosis naming the revocation, and nothing it publishes reaches the log any more."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from bench.cluster import Proc, shoal_argv
from bench.hosts import Network
from bench.netclient import ClientCall, stream_chat
from eventlog.log import EventLog
from events.catalogue import NodeLeft
from events.ids import NodeId, TaskId
from events.state import State
from services.config import ShoalConfig, resolve_config
from services.credentials import endpoint_for
from services.nats_certs import CA_CERT, host_files, write_certs
from services.nats_permissions import Identity

pytestmark = pytest.mark.timeout(480)  # a cold tiny model loads in minutes on a loaded 2-core machine

API_KEY = "netns-join-key-0123456789"
PORT = 4222


def _ready(base_url: str) -> bool:
    try:
        health = httpx.get(f"{base_url}/healthz", timeout=3).json()
    except (httpx.HTTPError, ValueError):
        return False
    return int(health.get("ready_instances", 0)) >= 1


def _shoal(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(shoal_argv(*args), env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_fresh_host_joins_with_a_token_serves_and_is_cut_off_when_revoked(
    netns_available: None, tmp_path: Path
) -> None:
    net = Network()
    procs: list[Proc] = []
    try:
        control, w0 = net.add("control"), net.add("w0")
        certs = tmp_path / "certs"
        write_certs(certs, [control.address, w0.address])
        control_cert, control_key = (str(certs / name) for name in host_files(control.address))
        w0_cert, w0_key = (str(certs / name) for name in host_files(w0.address))
        base = {
            **os.environ,
            "SHOAL_DATA_DIR": str(tmp_path / "data"),  # the tiny model's cache, shared like a model volume
            "SHOAL_TASK_STALL_SECONDS": "12",
            "SHOAL_NODE_TIMEOUT_SECONDS": "6",
        }
        on_control = {
            **base,
            "SHOAL_NATS_HOST": control.address,
            "SHOAL_NATS_PORT": str(PORT),
            "SHOAL_NATS_TLS_CA": str(certs / CA_CERT),
            "SHOAL_NATS_TLS_CERT": control_cert,
            "SHOAL_NATS_TLS_KEY": control_key,
            "SHOAL_API_HOST": control.address,
            "SHOAL_API_KEYS": f"{API_KEY}:admin",
        }
        nats = Proc("nats", control.argv(*shoal_argv("nats")), on_control, tmp_path)
        procs.append(nats)
        nats.wait_for_line(re.compile(r"JetStream at tls://"), 60)

        made = _shoal(on_control, "nats", "token", "create", "--node", "w0", "--ttl", "10m")
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()
        assert "shoal worker --join" in made.stderr
        # What the new machine has: its own TLS client certificate (the server verifies clients),
        # no seed, no CA: the token pins the CA.
        on_w0 = {
            **base,
            "SHOAL_NATS_CREDENTIALS_DIR": str(tmp_path / "w0-identities"),
            "SHOAL_NATS_TLS_CERT": w0_cert,
            "SHOAL_NATS_TLS_KEY": w0_key,
        }
        url = f"tls://{control.address}:{PORT}"
        worker = Proc(
            "w0", w0.argv(*shoal_argv("worker", "--join", url, "--token", token, "--host", w0.address)), on_w0, tmp_path
        )
        procs.append(worker)
        worker.wait_for_line(re.compile(r"joined .* as node 'w0'"), 60)
        for name in ("master", "api"):
            procs.append(Proc(name, control.argv(*shoal_argv(name)), on_control, tmp_path))

        base_url = f"http://{control.address}:8000"
        deadline = time.monotonic() + 360
        while not _ready(base_url):
            assert time.monotonic() < deadline, "\n".join(p.tail(1500) for p in procs)
            time.sleep(0.5)
        headers = {"authorization": f"Bearer {API_KEY}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=60) as http:
            served = stream_chat(http, "hello", 8, bound_seconds=120)
            assert served.outcome == "completed" and served.text, served

            # The same token again, from another machine: refused, saying what to do.
            again = _shoal(
                {**on_w0, "SHOAL_NATS_CREDENTIALS_DIR": str(tmp_path / "other")},
                "worker",
                "--join",
                url,
                "--token",
                token,
            )
            assert again.returncode == 1 and "used already" in again.stderr and "token create" in again.stderr

            # Revoked while it streams: cut off, and the task fails saying why.
            revoked_at: list[float] = []
            streaming = threading.Event()

            def on_event(call: ClientCall) -> None:
                if call.text:
                    streaming.set()

            calls: list[ClientCall] = []
            client = threading.Thread(
                target=lambda: calls.append(stream_chat(http, "count", 4000, bound_seconds=90, on_event=on_event))
            )
            client.start()
            assert streaming.wait(60), "the long request never streamed"
            revoke = _shoal(on_control, "nats", "revoke-node", "w0")
            revoked_at.append(time.monotonic())
            assert revoke.returncode == 0, revoke.stderr + revoke.stdout
            assert "the server dropped its connections" in revoke.stdout
            client.join(120)
            [call] = calls
            assert call.outcome == "failed", call
            assert time.monotonic() - revoked_at[0] < 60

        admin_config = resolve_config(env=on_control).config
        state, after_left = asyncio.run(_read_back(admin_config, TaskId(call.task_id)))
        failed = state.tasks[TaskId(call.task_id)]
        assert failed.status == "failed" and "revoked" in failed.error, failed
        assert state.nodes[NodeId("w0")].status == "left"
        assert after_left == [], f"the revoked node still published: {after_left}"
    finally:
        for proc in procs:
            proc.stop(grace=5)
        net.close()


async def _read_back(config: ShoalConfig, task: TaskId) -> tuple[State, list[str]]:
    """The State, and what node w0 published after its NodeLeft (nothing, once it is cut off)."""
    endpoint = endpoint_for(config, Identity("admin"))
    log = await EventLog.connect(endpoint, ensure=False)
    try:
        state = await log.fold()
        after: list[str] = []
        left_seen = False
        async for _, event in log.replay():
            if isinstance(event, NodeLeft) and event.node_id == "w0":
                left_seen = True
            elif left_seen and event.env.origin.node == "w0":
                after.append(type(event).__name__)
    finally:
        await log.close()
    assert task in state.tasks
    return state, after
