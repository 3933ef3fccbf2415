"""Pure helpers: BLAS env and threads, the lockstep vote, stop strings, phase tracker, hostfile, pending-send-free imports."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from runner.blas import BLAS_SHARE_ENV, BlasSettingError, BlasThreads, blas_env
from runner.engine.protocols import PhaseTracker
from runner.engine.shared_cores import LOCKSTEP_WEIGHT_BYTES, lockstep_vote
from runner.engine.stops import TextAssembler
from runner.local.launch import ring_hostfile

pytestmark = pytest.mark.timeout(20)
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def test_blas_auto_preloads_and_splits_threads() -> None:
    """Ranks sharing a node: a pool of every core's thread, a share for when they compute at once,
    and idle threads that stop spinning before another rank's turn."""
    env = blas_env("auto", ranks_on_node=2, cpu_count=2, base_env={}, exists=lambda p: p == OPENBLAS)
    assert env == {
        "LD_PRELOAD": OPENBLAS,
        "OPENBLAS_NUM_THREADS": "2",
        BLAS_SHARE_ENV: "1",
        "OPENBLAS_THREAD_TIMEOUT": "22",
    }
    alone = blas_env("auto", ranks_on_node=1, cpu_count=2, base_env={}, exists=lambda p: p == OPENBLAS)
    assert alone == {"LD_PRELOAD": OPENBLAS, "OPENBLAS_NUM_THREADS": "2", BLAS_SHARE_ENV: "2"}  # OpenBLAS's spin
    kept = blas_env("auto", 2, 2, {"OPENBLAS_THREAD_TIMEOUT": "10"}, exists=lambda p: p == OPENBLAS)
    assert "OPENBLAS_THREAD_TIMEOUT" not in kept


def test_blas_threads_switch_between_the_share_and_every_core_only_when_they_change() -> None:
    calls: list[int] = []
    threads = BlasThreads.from_env({"OPENBLAS_NUM_THREADS": "4", BLAS_SHARE_ENV: "2"})
    threads = BlasThreads(threads.every, threads.share, calls.append)
    assert (threads.every, threads.share, calls) == (4, 2, [])  # the pool as the environment made it
    threads.overlapping(True)  # a rank starts at its share (`at_share`)
    assert calls == [2]
    threads.overlapping(False)
    threads.overlapping(False)
    threads.overlapping(True)
    assert calls == [2, 4, 2]
    pinned = BlasThreads.from_env({"OPENBLAS_NUM_THREADS": "3"})  # the caller pinned it: never switched
    assert (pinned.every, pinned.share) == (1, 1)
    unswitched: list[int] = []
    BlasThreads(2, 2, unswitched.append).overlapping(False)  # a rank alone on its node: nothing to switch
    assert unswitched == []
    assert BlasThreads.from_env({"OPENBLAS_NUM_THREADS": "x", BLAS_SHARE_ENV: "-1"}).share == 1


def test_ranks_vote_for_the_lockstep_decode_only_together_on_one_machine_with_heavy_layers() -> None:
    heavy, light = LOCKSTEP_WEIGHT_BYTES, LOCKSTEP_WEIGHT_BYTES - 1
    assert lockstep_vote(world=2, ranks_on_host=2, layer_bytes=heavy)
    assert not lockstep_vote(world=2, ranks_on_host=2, layer_bytes=light)  # its own overhead: the ring overlaps it
    assert not lockstep_vote(world=3, ranks_on_host=2, layer_bytes=heavy)  # a rank elsewhere: the ring
    assert not lockstep_vote(world=1, ranks_on_host=1, layer_bytes=heavy)  # one rank: nothing to agree


def test_blas_keeps_existing_preload_and_pinned_threads() -> None:
    base = {"LD_PRELOAD": "/x.so", "OPENBLAS_NUM_THREADS": "3"}
    env = blas_env(None, ranks_on_node=4, cpu_count=2, base_env=base, exists=lambda p: p == OPENBLAS)
    assert env == {"LD_PRELOAD": f"{OPENBLAS}:/x.so"}


def test_blas_off_and_missing_library() -> None:
    assert blas_env("off", 2, 2, {}, exists=lambda p: True) == {}
    assert blas_env("auto", 3, 2, {}, exists=lambda p: False) == {
        "OPENBLAS_NUM_THREADS": "2",
        BLAS_SHARE_ENV: "1",
        "OPENBLAS_THREAD_TIMEOUT": "22",
    }
    with pytest.raises(BlasSettingError, match="no such file"):
        blas_env("/nope.so", 1, 2, {}, exists=lambda p: False)
    assert blas_env("/mine.so", 1, 8, {}, exists=lambda p: True)["LD_PRELOAD"] == "/mine.so"


def test_text_assembler_holds_back_a_possible_stop_string() -> None:
    text = TextAssembler(stop=["END"])
    assert text.add(1, "hello E") == ("hello ", [1])  # "E" might start "END": held back
    assert text.add(2, "N") == ("", [])
    assert text.add(3, "Dx") == ("", [2, 3])
    assert text.stopped and text.text == "hello "
    assert text.matched == "END"


def test_text_assembler_names_the_stop_string_that_matched_first_in_the_text() -> None:
    text = TextAssembler(stop=["zz", "b", "ab"])
    assert text.add(1, "xab")[0] == "x"
    assert text.stopped and text.matched == "ab"  # starts before "b" does
    alone = TextAssembler(stop=["END"])
    alone.add(1, "done")
    alone.finish()
    assert alone.matched is None


def test_text_assembler_releases_false_alarms_and_finishes() -> None:
    text = TextAssembler(stop=["END"])
    assert text.add(1, "E") == ("", [])
    assert text.add(2, "x") == ("Ex", [1, 2])
    assert text.add(3, "E") == ("", [])
    assert text.finish() == ("E", [3])
    assert not text.stopped


def test_text_assembler_without_stops_streams_everything() -> None:
    text = TextAssembler(stop=[])
    assert text.add(7, "a") == ("a", [7])
    assert text.add(None, "b") == ("b", [])


def test_phase_tracker_is_readable_from_another_thread() -> None:
    phases = PhaseTracker()
    assert phases.snapshot().phase == "idle"
    thread = threading.Thread(target=phases.enter, args=("prefill", "t1", 3))
    thread.start()
    thread.join()
    snap = phases.snapshot()
    assert (snap.phase, snap.task_id, snap.iteration) == ("prefill", "t1", 3)


def test_ring_hostfile_has_one_address_list_per_rank() -> None:
    assert ring_hostfile([5000, 5001]) == [["127.0.0.1:5000"], ["127.0.0.1:5001"]]


MLX_FREE = (
    "local/launch.py",
    "blas.py",
    "engine/plan.py",
    "engine/protocols.py",
    "errors.py",
    "models/model_info.py",
    "local/local_run.py",
    "engine/stops.py",
    "models/chat.py",
    "local/testing/tools.py",
    "models/tiny_tokenizer.py",
)


@pytest.mark.parametrize("name", MLX_FREE)
def test_cli_side_runner_modules_do_not_import_mlx_at_module_level(name: str) -> None:
    tree = ast.parse((Path(__file__).parents[2] / "runner" / name).read_text())
    imported = set()
    for node in tree.body:  # module level only; lazy imports inside functions are the point
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not {m for m in imported if m.split(".")[0] in ("mlx", "mlx_lm")}
