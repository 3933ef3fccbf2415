"""What `shoal bench serve` serves and with what: its models and its sides.

Models are random weights in standard mlx-lm directories, sharing the tiny model's tokenizer:
`tiny` (the 8-layer llama of the tests), `qwen3-100m`, a qwen3 shape of about 100M
parameters, so that compute, not only overhead, is measured, and `qwen3-25m` (`shoal bench
models`' second model). Sides are servers that speak the
OpenAI API on a port: `mlx_lm.server` (the anchor, its batching on) and `shoal up` clusters.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import httpx

from bench.cluster import Cluster, free_port, setting_env

# A qwen3 of ~100M parameters: 16 layers of 6.3M (attention 1.6M, MLP 4.7M) and a 0.8M embedding.
QWEN3_100M: dict[str, Any] = {
    "model_type": "qwen3",
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
# A qwen3 of ~25M parameters: 8 layers of 3.1M (attention 0.8M, MLP 2.4M), `shoal bench models`'
# second model, a family other than the tiny llama, small enough to load in a fraction of a second.
QWEN3_25M: dict[str, Any] = {
    **QWEN3_100M,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
# A qwen3 of ~0.44B parameters where compute, not serving, dominates: Qwen3-0.6B's layers (28 of
# 15.7M: attention 6.3M, MLP 9.4M) with the tiny tokenizer's 1,024 tokens (the real vocabulary would
# add 156M of embedding that a decode step reads one row of). In float32 (mlx's default, as written),
# which MLX's CPU backend decodes fastest here: `bench.dtype_probe` (a 4-layer slice of this shape,
# dtypes alternating in one process, in a runner's layout: its OpenBLAS preloaded, its threads
# pinned), 2 rounds on the shared 2-core EPYC (load 6-9): a decode step of 1 row took 78 / 39 ms in
# float32 and 117 / 66 ms in 4-bit (group 64), of 16 rows 121 / 59 ms against 1,033 / 1,015 ms; an
# earlier round under load 13-26 read the same order (16 rows: 329 against 13,407 ms). Without the
# preload (no runner lacks it) float32 was the slower one for 1 row: 813 / 4,062 ms (1 / 16 rows)
# against 548 / 11,236 in 4-bit, 382 / 11,237 in 8-bit, 696 / 3,227 in bfloat16 (one round under
# load; 8-bit and bfloat16 not measured with the preload). MLX's CPU quantized matmul is one
# thread's kernel; float32's goes to BLAS, so a batch, what serving decodes, runs 8-17x faster in it.
QWEN3_06B: dict[str, Any] = {
    **QWEN3_100M,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 1000000.0,
}
RANDOM_SHAPES: dict[str, dict[str, Any]] = {"qwen3-100m": QWEN3_100M, "qwen3-25m": QWEN3_25M, "qwen3-0.6b": QWEN3_06B}
MODELS = ("tiny", "qwen3-100m", "qwen3-0.6b")  # what `shoal bench serve` measures
# Where compute dominates, shoal's engine alone (one process, no services) is the served side's ceiling.
COMPUTE_BOUND = ("qwen3-0.6b",)
KNOWN_MODELS = ("tiny", *RANDOM_SHAPES)
# mlx_lm.server batches up to this many decodes and prefills at once (its defaults are lower).
ANCHOR_DECODE_CONCURRENCY = 64
ANCHOR_PROMPT_CONCURRENCY = 8


def model_dir(name: str, data_dir: Path) -> Path:
    """The directory of model `name` under `data_dir`, written on first use, in a subprocess
    (`main`): writing weights imports mlx, which the bench's own process never does."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    out = data_dir / "models" / name
    if name != "tiny" and (out / "model.safetensors").exists():
        return out
    env = {**os.environ, "SHOAL_DATA_DIR": str(data_dir)}
    argv = [sys.executable, "-m", "bench.serve_sides", name, str(out)]
    return Path(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip())


def main(argv: list[str]) -> int:
    """Write model `argv[0]` (into `argv[1]` unless it is `tiny`, which is cached) and print its directory."""
    from runner.models.tiny import cached_tiny, write_random_model

    tiny = cached_tiny()
    name, out = argv[0], Path(argv[1])
    if name == "tiny":
        print(tiny)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / file, out / file)
    eos = json.loads((tiny / "config.json").read_text())["eos_token_id"]
    print(write_random_model(out, {**RANDOM_SHAPES[name], "eos_token_id": eos}, seed=1))
    return 0


class Side(Protocol):
    name: str
    base_url: str

    async def events_stored(self) -> int | None: ...
    def stop(self) -> None: ...


class AnchorServer:
    """`mlx_lm.server` on the model, batching on, with a 1-rank runner's BLAS environment and,
    `pinned`, its compute CPU (`bench.anchor_server`); unpinned it runs as a user starts it."""

    def __init__(
        self,
        model: Path,
        log_dir: Path,
        max_tokens: int,
        decode_concurrency: int = ANCHOR_DECODE_CONCURRENCY,
        *,
        pinned: bool = False,
    ) -> None:
        from runner.affinity import COMPUTE_CPU_ENV, compute_cpu_env  # no mlx import
        from runner.blas import blas_env

        self.name = "mlx_lm_server_pinned" if pinned else "mlx_lm_server"
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        env = {**os.environ, **blas_env(os.environ.get("SHOAL_BLAS"), 1, os.cpu_count() or 1, os.environ)}
        env.pop(COMPUTE_CPU_ENV, None)
        if pinned:
            env |= compute_cpu_env(0, 1)  # as a 1-worker node places its one runner
        argv = [
            sys.executable,
            "-m",
            "bench.anchor_server",
            "--model",
            str(model),
            "--port",
            str(port),
            "--log-level",
            "WARNING",
            "--max-tokens",
            str(max_tokens),
            "--decode-concurrency",
            str(decode_concurrency),
            "--prompt-concurrency",
            str(ANCHOR_PROMPT_CONCURRENCY),
        ]
        self._log_path = log_dir / f"{self.name}.err"
        self._log = self._log_path.open("wb")
        self._process = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"mlx_lm.server exited: {self._log_path.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"mlx_lm.server not up within {timeout}s")

    async def events_stored(self) -> int | None:
        return None  # no event log

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


class EngineAloneSide:
    """shoal's engine alone on the model (`bench.engine_alone`: a 1-rank runner's continuous batch
    in one process, pinned as the runner is, no services), asked for a whole level of clients."""

    def __init__(self, model: Path, log_dir: Path, max_tokens: int) -> None:
        from bench.engine_alone import engine_alone
        from bench.serve_load import PROMPT
        from events.runner_settings import RunnerSettings

        self.name = "shoal_engine_alone"
        step = RunnerSettings().prefill_step_size  # the served instance's default
        self._side = engine_alone(dict(os.environ), str(model), PROMPT, max_tokens, step, log_dir)

    def wait_ready(self) -> None:
        self._side.__enter__()

    def level(self, concurrency: int, requests_each: int) -> dict[str, Any]:
        return self._side.ask(f"level {concurrency} {requests_each}")

    def stop(self) -> None:
        self._side.__exit__(None, None, None)


class ShoalSide:
    """`shoal up --workers N` on the model; its log's length counts the events a level stored."""

    def __init__(
        self, model: Path, root: Path, workers: int, max_queued_tasks: int, name: str | None = None, **settings: str
    ) -> None:
        self.name = name or f"shoal_{workers}w"
        home = root / self.name
        home.mkdir(parents=True)
        self.cluster = Cluster(
            home,
            workers=workers,
            env=setting_env(settings),
            models=str(model),
            max_queued_tasks=str(max_queued_tasks),
            log_level="WARNING",
        )
        self.base_url = self.cluster.base_url

    async def events_stored(self) -> int | None:
        from eventlog.log import EventLog

        log = await EventLog.connect(self.cluster.admin_endpoint(), name="shoal-bench-serve", ensure=False)
        try:
            return await log.last_seq("events")
        finally:
            await log.close()

    def stop(self) -> None:
        self.cluster.stop()


def events_between(side: Side, before: int | None) -> int | None:
    after = asyncio.run(side.events_stored())
    return None if before is None or after is None else after - before


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
