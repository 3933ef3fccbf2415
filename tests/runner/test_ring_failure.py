"""A rank whose ring port another program holds says which port, and what to do about it; a ring
group that joined ranks of different placements says so on every rank before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.local.launch import free_ports, rank_env, ring_hostfile
from runner.service.main import ring_failure

HOSTS = ["10.0.0.1:29100", "10.0.0.2:29101"]


def test_a_port_held_elsewhere_is_named_with_its_rank_and_the_setting() -> None:
    said = ring_failure("[ring] Couldn't bind socket (error: 98)", HOSTS, 1)
    assert said.startswith("[ring] Couldn't bind socket (error: 98)")  # mlx's words stay first
    assert "10.0.0.2:29101 of rank 1 is held by another program" in said and "ring_base_port" in said


def test_other_ring_errors_pass_unchanged() -> None:
    assert ring_failure("[ring] Connect failed (error: 111)", HOSTS, 0) == "[ring] Connect failed (error: 111)"


MEMBER_PROGRAM = """
import os, sys
import mlx.core as mx
from runner.engine.collectives import Collectives
from runner.errors import RingMismatch

group = mx.distributed.init(backend="ring", strict=True)
try:
    Collectives(group).check_members(sys.argv[1])
except RingMismatch as exc:
    print("mismatch:", exc)
else:
    print("members: ok")
"""


def _ring_of(identities: list[str], tmp_path: Path) -> list[str]:
    """Each rank of one real ring group runs the member check with its own identity."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps(ring_hostfile(free_ports(len(identities)))))
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", MEMBER_PROGRAM, identity],
            env=rank_env(rank, len(identities), hostfile, dict(os.environ)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, identity in enumerate(identities)
    ]
    said = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err[-2000:]
        said.append(out.strip().splitlines()[-1])
    return said


@pytest.mark.timeout(90)
def test_ranks_of_different_placements_in_one_ring_all_refuse_it_before_any_work(tmp_path: Path) -> None:
    """What two clusters on one host that took the same ring ports build: rank 0 of one placement
    connected to rank 1 of another. Both say so at once (they agreed on nonsense, or waited until
    the stall deadline, when they went on to serve)."""
    said = _ring_of(["inst-tiny-0@1000:127.0.0.1:1,127.0.0.1:2", "inst-tiny-0@2000:127.0.0.1:1,127.0.0.1:2"], tmp_path)
    assert all(line.startswith("mismatch:") and "ring_base_port" in line for line in said), said
    assert _ring_of(["same"] * 3, tmp_path) == ["members: ok"] * 3
    said = _ring_of(["a", "a", "b"], tmp_path)
    assert all(line.startswith("mismatch:") for line in said), said
