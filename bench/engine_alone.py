"""shoal's engine alone, no services: a 1-rank runner's decode loop in one process, the side of
`shoal bench e2e` between bare mlx-lm and `shoal up --workers 1`.

Run as `python -m bench.engine_alone MODEL_DIR PROMPT MAX_TOKENS PREFILL_STEP` by the bench, in a
subprocess with a 1-rank runner's BLAS environment and compute CPU (`runner.affinity`). It builds what a 1-rank runner builds
(`load_shard`, `Engine`, its warm-up, `continuous_batch` with the instance's default settings but
the bench's prefill step) and hands each request to `ContinuousBatch.step` as the runner's serving
loop does; the sink only notes when text arrives. A request of its own prompt (`go`) finds its KV
in the prefix cache from the second on, as on the 1-worker side (warm); one of a fresh prompt
(`go <JSON string>`) prefills it (cold). It speaks `bench.bare_mlx`'s protocol (`ready`,
then one JSON line per `go`) and times the first and last piece of text as the other sides do.
Its decode rate over bare mlx-lm's is what shoal's decode loop costs; `shoal up --workers 1`'s over
this one is what serving adds: the runner's bridge and events, NATS, the API, HTTP and the client.
`shoal bench serve` asks it for a whole level of clients (`level C R`): the batch's aggregate rate in
one process with no services, the ceiling of the served side on a model whose compute dominates.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.bare_mlx import StdioSide, serve_stdio
from events.logprobs import TokenLogprob
from runner.affinity import compute_cpu_env, pin_compute_threads
from runner.engine.protocols import NullSink


class TextTimes(NullSink):
    """A runner sink that keeps when text first and last arrived and how many tokens came (`count`)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.count = 0

    def tokens(
        self,
        task_id: str,
        index: int,
        text: str,
        token_ids: list[int],
        logprobs: list[TokenLogprob] | None = None,
        choice: int = 0,
    ) -> None:
        self.count += len(token_ids)
        if text:
            self.last = time.perf_counter()
            self.first = self.last if self.first is None else self.first


def main(argv: list[str]) -> int:
    pin_compute_threads(os.environ)  # first, as a runner does (runner.affinity)
    from events.runner_settings import RunnerSettings
    from runner.engine.alone import warm_up
    from runner.engine.batch_streams import Admission, still_pending
    from runner.engine.engine import Engine
    from runner.engine.protocols import NeverCancelled, PhaseTracker
    from runner.engine.requests import GenerationRequest
    from runner.engine.shard import ShardPlacement
    from runner.heap import settle_heap
    from runner.models.chat import encode_chat
    from runner.models.model_info import read_model_info
    from runner.service.main import continuous_batch
    from runner.shard_loading import load_shard

    model_dir, prompt, max_tokens, step = Path(argv[0]), argv[1], int(argv[2]), int(argv[3])
    layers = read_model_info(model_dir).n_layers
    shard = load_shard(model_dir, ShardPlacement(0, 1, ((0, layers),)), None)
    engine = Engine(None, shard, RunnerSettings(prefill_step_size=step))
    phases = PhaseTracker()
    warm_up(engine, phases)
    batch = continuous_batch(engine, phases)
    settle_heap()
    counter = iter(range(sys.maxsize))

    def one(text: str | None) -> dict[str, Any]:
        prompt_ids = encode_chat(shard.tokenizer, [{"role": "user", "content": text or prompt}])
        task_id = f"bench-{next(counter)}"
        sink = TextTimes()
        request = GenerationRequest(task_id=task_id, prompt_token_ids=prompt_ids, max_tokens=max_tokens)
        admission = Admission(task_id, request, NeverCancelled(), sink)
        waiting = [admission]  # read by the step after its forward, as the serving loop's pending list
        started = time.perf_counter()
        while waiting or batch.busy:
            if task_id in batch.step(waiting.copy).admitted:
                waiting.clear()
        first, last = sink.first or started, sink.last or started
        rate = (sink.count - 1) / (last - first) if sink.count > 1 and last > first else 0.0
        return {"ttft_ms": (first - started) * 1000, "decode_tps": rate, "tokens": sink.count}

    def level(words: str) -> dict[str, Any]:
        """`level C R`: C clients at once, each sending R requests of the side's prompt one after
        another, as `shoal bench serve`'s load does through HTTP; aggregate tokens/s over the wall time."""
        concurrency, requests_each = (int(word) for word in words.split())
        prompt_ids = encode_chat(shard.tokenizer, [{"role": "user", "content": prompt}])
        left = dict.fromkeys(range(concurrency), requests_each)
        client_of: dict[str, int] = {}
        sinks: list[TextTimes] = []
        waiting: list[Admission] = []

        def send(client: int) -> None:
            task_id, sink = f"bench-{next(counter)}", TextTimes()
            request = GenerationRequest(task_id=task_id, prompt_token_ids=prompt_ids, max_tokens=max_tokens)
            waiting.append(Admission(task_id, request, NeverCancelled(), sink))
            client_of[task_id], left[client] = client, left[client] - 1
            sinks.append(sink)

        for client in range(concurrency):
            send(client)
        failed = 0
        started = time.perf_counter()
        while waiting or batch.busy:
            result = batch.step(waiting.copy)
            waiting[:] = still_pending(waiting, result.admitted)
            for ended in result.ended:
                failed += ended.outcome is None
                if left[client_of[ended.task_id]]:
                    send(client_of[ended.task_id])
        wall = time.perf_counter() - started
        tokens = sum(sink.count for sink in sinks)
        return {
            "requests": len(sinks),
            "errors": failed,
            "tokens": tokens,
            "wall_s": wall,
            "aggregate_tps": tokens / wall,
        }

    return serve_stdio(one, commands={"level": level})


def engine_alone(
    env: dict[str, str], model_dir: str, prompt: str, max_tokens: int, step: int, log_dir: Path
) -> StdioSide:
    """The engine-alone process, with a 1-rank runner's BLAS environment and compute CPU."""
    from runner.blas import blas_env

    child_env = {**env, **blas_env(env.get("SHOAL_BLAS"), 1, os.cpu_count() or 1, env), **compute_cpu_env(0, 1)}
    argv = [sys.executable, "-m", "bench.engine_alone", model_dir, prompt, str(max_tokens), str(step)]
    return StdioSide(argv, child_env, log_dir / "engine_alone.err")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
