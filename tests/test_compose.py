"""compose.nats.yaml: its three nodes form a JetStream cluster that holds an R3 SHOAL_EVENTS.

No Docker engine runs here, so the test reads the file and starts each service's command as a
local nats-server process: hostnames map to 127.0.0.1 and each node's container ports (client,
cluster, monitoring) and /data volume map to a free loopback port and a temp dir of its own.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
import yaml

from eventlog.log import EventLog, LogError
from eventlog.streams import LogSettings
from events.synthetic import synthetic_history
from services.nats import find_nats_server, free_port, read_info

ROOT = Path(__file__).resolve().parent.parent
PORT_FLAGS = ("--port", "--http_port")


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


def test_the_file_describes_three_routed_jetstream_nodes_with_volumes_and_client_ports() -> None:
    services = load_services()
    assert sorted(services) == ["nats-1", "nats-2", "nats-3"]
    published: set[str] = set()
    for name, service in services.items():
        options = flags(service["command"])  # type: ignore[arg-type]
        assert "--jetstream" in options and options["--server_name"] == name
        assert options["--cluster_name"] == "shoal"
        routes = options["--routes"].split(",")
        assert sorted(routes) == [f"nats://nats-{i}:6222" for i in (1, 2, 3)]
        volume, _, target = service["volumes"][0].partition(":")  # type: ignore[index]
        assert target == options["--store_dir"] and volume == f"{name}-data"
        client = [p for p in service["ports"] if p.endswith(f":{options['--port']}")]  # type: ignore[union-attr]
        assert len(client) == 1
        published.add(client[0].split(":")[0])
    assert len(published) == 3, "each node publishes its client port on a different host port"


class Node:
    def __init__(self, name: str, client: int, cluster: int, http: int) -> None:
        self.name, self.client, self.cluster, self.http = name, client, cluster, http


def local_command(name: str, service: dict[str, object], nodes: dict[str, Node], tmp: Path) -> list[str]:
    """The service's command with hostnames -> 127.0.0.1, container ports and /data -> local ones."""
    node = nodes[name]
    command: list[str] = list(service["command"])  # type: ignore[call-overload]
    volume, _, target = str(service["volumes"][0]).partition(":")  # type: ignore[index]
    out = [find_nats_server()]
    for index, token in enumerate(command):
        previous = command[index - 1] if index else ""
        if previous == "--port":
            token = str(node.client)
        elif previous == "--http_port":
            token = str(node.http)
        elif previous == "--store_dir" and token == target:
            token = str(tmp / volume)
        elif previous == "--cluster":
            token = f"nats://127.0.0.1:{node.cluster}"
        elif previous == "--routes":
            token = ",".join(
                f"nats://127.0.0.1:{nodes[r.split('//')[1].split(':')[0]].cluster}" for r in token.split(",")
            )
        out.append(token)
    return out


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Node]]:
    services = load_services()
    nodes = {name: Node(name, free_port(), free_port(), free_port()) for name in services}
    processes = [
        subprocess.Popen(
            local_command(name, service, nodes, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for name, service in services.items()
    ]
    try:
        deadline = time.monotonic() + 20
        while not all(read_info("127.0.0.1", n.client) for n in nodes.values()):
            assert time.monotonic() < deadline, "cluster nodes did not start"
            assert all(p.poll() is None for p in processes), "a node exited"
            time.sleep(0.05)
        yield nodes
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=15)


async def _connect_when_ready(url: str, settings: LogSettings) -> EventLog:
    deadline = time.monotonic() + 40
    while True:  # JetStream needs a meta leader before it accepts streams
        try:
            return await EventLog.connect(url, settings)
        except (LogError, nats.js.errors.Error, nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@pytest.mark.timeout(90)
async def test_the_compose_cluster_holds_an_r3_events_stream(cluster: dict[str, Node]) -> None:
    urls = [f"nats://127.0.0.1:{node.client}" for node in cluster.values()]
    settings = LogSettings(replicas=3)
    log = await _connect_when_ready(urls[0], settings)
    other = await EventLog.connect(urls[2], settings, ensure=False)
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
