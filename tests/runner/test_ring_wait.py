"""The ring's blocking wait (`runner/ring_wait.py`) and the agreement built on it
(`runner/engine/collectives.py`): exact sums on real ring groups, and a rank that waits for a slow
peer spends (almost) no CPU doing so, where mlx's ring all-reduce spun a core for the whole wait."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.local.launch import free_ports, rank_env, ring_hostfile
from runner.ring_wait import RingInbound, accepted_on

SLOW_PEER_S = 1.0
WAITING_CPU_MAX_S = 0.15  # spinning costs ~SLOW_PEER_S here (>= 0.45 s even on a loaded host)


def _connected_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_accepted_on_finds_only_the_connection_accepted_on_the_address() -> None:
    listener, client, accepted = _connected_pair()
    try:
        found = accepted_on([listener.fileno(), client.fileno(), accepted.fileno(), 0], listener.getsockname())
        assert [s.getpeername() for s in found] == [client.getsockname()]
        for sock in found:
            sock.close()
        assert accepted.fileno() >= 0  # the duplicate's close left the original open
        accepted.sendall(b"x")
        assert client.recv(1) == b"x"
    finally:
        for sock in (listener, client, accepted):
            sock.close()


def test_a_duplicate_the_search_made_is_not_found_again_under_its_own_number() -> None:
    """The descriptors are listed before the search duplicates them: a duplicate takes the lowest
    free number, which may come later in that list (the listing's own, closed, descriptor)."""
    listener, client, accepted = _connected_pair()
    probe = os.dup(0)
    os.close(probe)  # the number the next duplicate will take
    try:
        found = accepted_on([accepted.fileno(), probe], listener.getsockname())
        assert len(found) == 1
        for sock in found:
            sock.close()
    finally:
        for sock in (listener, client, accepted):
            sock.close()


def test_the_search_leaves_no_descriptor_of_its_own_open() -> None:
    """Every descriptor it looks at is duplicated; a duplicate that is not a wanted socket (a
    pipe, a file, a listener) is closed again, not left to the process for its lifetime."""
    listener, client, accepted = _connected_pair()
    reading, writing = os.pipe()
    try:
        before = sorted(os.listdir("/proc/self/fd"))
        for _ in range(20):
            assert accepted_on([reading, writing, listener.fileno(), client.fileno()], ("127.0.0.1", 1)) == []
        assert sorted(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(reading)
        os.close(writing)
        for sock in (listener, client, accepted):
            sock.close()


def test_wait_returns_when_bytes_come_and_gives_up_at_its_limit() -> None:
    listener, client, accepted = _connected_pair()
    # A limit well above a busy machine's scheduling delays (the suite runs on two workers), so
    # "returned at once" and "waited out its limit" cannot be mistaken for each other.
    inbound = RingInbound(accepted_on([accepted.fileno()], listener.getsockname()), limit_seconds=1.0)
    try:
        started = time.monotonic()
        inbound.wait()  # nothing sent: the limit ends it
        assert 0.95 <= time.monotonic() - started < 5.0
        client.sendall(b"x")
        started = time.monotonic()
        inbound.wait()
        assert time.monotonic() - started < 0.5
        assert accepted.recv(1) == b"x"  # the wait read nothing
    finally:
        inbound.close()
        for sock in (listener, client, accepted):
            sock.close()
    RingInbound([]).wait()  # nothing to watch: returns at once


RANK_PROGRAM = """
import json, os, resource, sys, time
import mlx.core as mx
from runner.engine.collectives import Collectives
from runner.ring_wait import RingInbound

rank, slow = int(os.environ["MLX_RANK"]), float(sys.argv[1])
group = mx.distributed.init(backend="ring", strict=True)
hosts = [entry[0] for entry in json.loads(open(os.environ["MLX_HOSTFILE"]).read())]
inbound = RingInbound.find(hosts, rank)
collectives = Collectives(group, inbound)
world = collectives.world
rounds = []
for sleeper in range(world):
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    if rank == sleeper:
        time.sleep(slow)
    summed = collectives.agree([rank + 1, 10 * rank, sleeper])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rounds.append({"summed": summed, "cpu": usage.ru_utime + usage.ru_stime - cpu})
print(json.dumps({"found": inbound.found, "rounds": rounds}))
"""


def _run_ring(world: int, tmp_path: Path) -> list[dict[str, object]]:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps(ring_hostfile(free_ports(world))))
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_PROGRAM, str(SLOW_PEER_S)],
            env=rank_env(rank, world, hostfile, dict(os.environ)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_agree_sums_exactly_and_a_waiting_rank_does_not_spin(world: int, tmp_path: Path) -> None:
    results = _run_ring(world, tmp_path)
    for rank, result in enumerate(results):
        assert result["found"] == 1, f"rank {rank} did not find its inbound ring socket"
        rounds = result["rounds"]
        assert isinstance(rounds, list)
        for sleeper, agreed in enumerate(rounds):
            expected = [world * (world + 1) // 2, 10 * world * (world - 1) // 2, world * sleeper]
            assert agreed["summed"] == expected
            if rank != sleeper:  # this rank waited ~SLOW_PEER_S for the sleeper
                assert agreed["cpu"] < WAITING_CPU_MAX_S, (rank, sleeper, agreed)
