"""Ids are NATS subject tokens: bad ones are refused with a message that says what is allowed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from events.ids import InvalidId, check_token, new_task_id


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "a*", "a>", ">", "ab\n", "x" * 129])
def test_bad_tokens_are_refused(bad: str) -> None:
    with pytest.raises(InvalidId, match="A-Z a-z 0-9 _ -"):
        check_token("node id", bad)


def test_good_tokens_and_new_task_ids_pass() -> None:
    assert check_token("node id", "node-1_a") == "node-1_a"
    assert check_token("task id", new_task_id()).startswith("task_")


def test_worker_refuses_a_node_id_with_a_dot_before_connecting() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli",
            "worker",
            "--node-id",
            "rack1.node2",
            "--nats-url",
            "nats://127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--node-id 'rack1.node2' is not a valid id" in done.stderr
