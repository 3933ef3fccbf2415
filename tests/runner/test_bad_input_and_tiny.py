"""Bad input fails in one line before any rank starts; make-tiny is byte-identical; CLI wiring."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from events.runner_settings import RunnerSettings
from events.task_params import TaskParams
from runner.engine.protocols import PhaseTracker
from runner.errors import ModelDirError, RequestError, SplitError
from runner.local.local_run import LocalRunSpec, build_job
from runner.models.tiny import cached_tiny
from services.cli import main as shoal

pytestmark = pytest.mark.timeout(120)


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_make_tiny_is_byte_identical_across_runs(tmp_path: Path) -> None:
    # Separate processes: nothing (RNG state, caches) can leak from one run into the other.
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.cli",
                "model",
                "make-tiny",
                "--out",
                str(tmp_path / name),
                "--layers",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("a", "b")
    ]
    assert [run.wait(timeout=100) for run in runs] == [0, 0]
    outs = [digest(tmp_path / name) for name in ("a", "b")]
    assert outs[0] == outs[1]
    assert set(outs[0]) == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def test_tiny_tokenizer_loads_with_transformers_and_has_a_chat_template() -> None:
    from transformers import AutoTokenizer

    from runner.models.chat import encode_chat

    tokenizer = AutoTokenizer.from_pretrained(str(cached_tiny()))
    ids = encode_chat(tokenizer, [{"role": "user", "content": "Hello, world!"}])
    text = tokenizer.decode(ids)
    assert text == "<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"


def _spec(**overrides: object) -> LocalRunSpec:
    return LocalRunSpec(**{"model": "tiny", "ranks": 2, "prompt_tokens": 8, **overrides})  # type: ignore[arg-type]


def _not_a_model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"hello": 1}))
    return tmp_path


def _no_layers(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize(
    ("make_dir", "message"),
    [
        (lambda tmp: tmp / "missing", "does not exist"),
        (_not_a_model, "not an mlx-lm model"),
        (_no_layers, "has no `layers`"),
    ],
)
def test_bad_model_dirs(tmp_path: Path, make_dir, message: str) -> None:
    with pytest.raises(ModelDirError, match=message):
        build_job(_spec(), make_dir(tmp_path))


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"split": [4, 3]}, SplitError, "covers 7 layers"),
        ({"split": [8]}, SplitError, "1 layer counts for 2 ranks"),
        ({"ranks": 9}, SplitError, "only 8 layers"),
        ({"prompt_tokens": None, "prompt": "  "}, RequestError, "empty prompt"),
        ({"prompt_tokens": 0}, RequestError, "empty prompt"),
        ({"params": TaskParams(max_tokens=0)}, RequestError, "max-tokens must be > 0"),
        ({"prompt_tokens": 5000}, RequestError, "context is 4096"),
        ({"prefill_step": 0}, RequestError, "invalid --prefill-step or --kv-bits: Expected `int` >= 1"),
        ({"kv_bits": 5}, RequestError, "invalid --prefill-step or --kv-bits: Invalid enum value 5"),
    ],
)
def test_bad_requests(overrides: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build_job(_spec(**overrides), cached_tiny())


def test_a_local_group_runs_with_the_cluster_defaults() -> None:
    settings = msgspec.convert(build_job(_spec(), cached_tiny())["settings"], RunnerSettings)
    assert settings == RunnerSettings()


def test_shoal_generate_prints_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert shoal(["generate", "--model", "tiny", "--ranks", "2", "--split", "1,1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "shoal generate: error: layer split covers 2 layers but the model has 8"


@pytest.mark.timeout(120)
def test_shoal_generate_json_on_three_ranks_matches_one_rank() -> None:
    def run(ranks: int) -> dict:
        cmd = [
            sys.executable,
            "-m",
            "services.cli",
            "generate",
            "--model",
            "tiny",
            "--ranks",
            str(ranks),
            "--prompt-tokens",
            "23",
            "--max-tokens",
            "16",
            "--json",
            "--no-warmup",
        ]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=100)
        return json.loads(done.stdout)

    three, one = run(3), run(1)
    assert three["token_ids"] == one["token_ids"] and len(one["token_ids"]) == 16
    assert three["path"] == "sequential" and len(three["progress"]) == 3
    assert three["progress"][0] == [[0, 23], [22, 23], [23, 23]]
    assert not three["cancelled"]


def test_a_product_job_refuses_the_test_tooling_keys() -> None:
    """`shoal generate`'s rank runs a request alone; a task asking for test tooling (a scripted batch,
    a failing sink...) must come in a job marked `testing` (`runner.local.testing`, not in the wheel)."""
    from runner.flight.faults import FaultInjector
    from runner.local.rank_main import run_task

    task = {"request": {"task_id": "t", "prompt_token_ids": [1, 2], "max_tokens": 1}, "failing_sink_rank": 0}
    with pytest.raises(ValueError, match=r"\['failing_sink_rank'\] are test tooling"):
        run_task(None, task, 0, FaultInjector(None, 0), PhaseTracker())  # type: ignore[arg-type]
