"""Builds the jobs the multi-rank tests run, one long-lived group per configuration.

A job is a list of tasks run in order on the same group, so "the next task on the same group"
is literally the next entry. Tokens are compared for the same chunk size on every world size
(`CHUNK`), as docs/ARCHITECTURE.md §6 promises equality only for the same chunking.
"""

from __future__ import annotations

import functools
import json
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from runner.engine.plan import (
    balanced_chunk_sizes,
    choose_path,
    chunk_sizes,
    effective_step,
    model_keys_per_token,
    rank_schedule,
)
from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny

if TYPE_CHECKING:
    from runner.engine.engine import Engine
    from runner.engine.protocols import RunnerSink
    from runner.engine.requests import GenerationOutcome, GenerationRequest

CHUNK = 6
LENGTHS = (1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 1, 3 * CHUNK + 1, 23)
MAX_TOKENS = 5
NEXT_MAX_TOKENS = 2
CANCEL_PROMPT = 3 * CHUNK + 1  # three chunks: pipeline and idle iterations on every rank
DECODE_CANCEL_STEPS = (0, 2)
KV8_LENGTHS = (13, 23)
DEFAULT_STEP = 4096


def step_for(world: int) -> int:
    """prefill_step_size giving chunks of CHUNK tokens on `world` ranks."""
    step = CHUNK * min(4, world)
    assert effective_step(step, world) == CHUNK
    return step


def request(task_id: str, length: int, path: str = "auto", max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "prompt_token_ids": synthetic_prompt(length),
        "max_tokens": max_tokens,
        "prefill_path": path,
    }


def prefill_chunks(length: int, path: str) -> list[int]:
    """The chunks a request alone takes (`plan.newcomer_prefill` admitted into an empty batch): a
    lone task's on the pipeline, chunks of equal cost at the tiny model's priced rate otherwise
    (the local groups here are not calibrated)."""
    if path == "pipeline":
        return chunk_sizes(length, CHUNK)
    return balanced_chunk_sizes(length, CHUNK, 0, tiny_keys_per_token())


def expected_callbacks(prompt_len: int, step: int) -> list[tuple[int, int]]:
    """The progress sequence of mlx-lm `stream_generate` for this prompt and step."""
    done = [0, *accumulate(chunk_sizes(prompt_len, step))]
    return [*((d, prompt_len) for d in done), (prompt_len, prompt_len)]


def alone_callbacks(length: int, path: str) -> list[tuple[int, int]]:
    """The progress a request alone reports: none done, each chunk, then the whole prompt with its
    first token (mlx-lm's `stream_generate` calls for the same chunks)."""
    done = [0, *accumulate(prefill_chunks(length, path))]
    return [*((d, length) for d in done), (length, length)]


def prefill_polls(length: int, world: int, path: str) -> int:
    """How often a request alone is polled for cancel before its first decode step. Pipeline: once
    per iteration of its whole GPipe prefill, then once at that step's agreement. Sequential: once
    per batch step from its first chunk until its last one has passed the last rank."""
    chunks = len(prefill_chunks(length, path))
    if path == "pipeline":
        return len(rank_schedule(0, world, chunks, path)) + 1
    return chunks + world - 1


@functools.cache
def tiny_keys_per_token() -> float | None:
    return model_keys_per_token(json.loads((cached_tiny() / "config.json").read_text()))


def sweep_tasks(world: int) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    paths = ("auto", "pipeline", "sequential") if world > 1 else ("auto",)
    for length in LENGTHS:
        for path in paths:
            tasks.append({"request": request(f"len{length}-{path}", length, path)})
    tasks.append({"request": request("wedge23", 23), "settings": {"prefill_step_size": DEFAULT_STEP}})
    for length in KV8_LENGTHS:
        tasks.append({"request": request(f"kv8-{length}", length), "settings": {"kv_bits": 8}})
    tasks.append({"request": request("cancelled-first", CANCEL_PROMPT), "cancel_before_start_ranks": [world - 1]})
    tasks.append({"request": request("after-cancelled-first", CANCEL_PROMPT)})
    sampled = {**request("sampled", CANCEL_PROMPT, max_tokens=8), "temperature": 0.8, "top_p": 0.9, "seed": 7}
    tasks.append({"request": sampled})
    tasks.append({"request": request("sink-fails", CANCEL_PROMPT), "failing_sink_rank": world - 1})
    tasks.append({"request": request("after-sink-fails", CANCEL_PROMPT)})
    tasks.append({"request": request("cancel-fails", CANCEL_PROMPT), "failing_cancel_rank": 0})
    tasks.append({"request": request("after-cancel-fails", CANCEL_PROMPT)})
    if world > 1:
        tasks.extend(cancel_tasks(world))
    return tasks


def cancel_paths(world: int) -> tuple[str, ...]:
    """Pipeline everywhere (idle iterations); sequential on 2 ranks only, to keep the suite fast."""
    return ("pipeline", "sequential") if world == 2 else ("pipeline",)


def cancel_tasks(world: int) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    for path in cancel_paths(world):
        polls = prefill_polls(CANCEL_PROMPT, world, path)
        for rank in range(world):
            for poll in [*range(polls), *(polls + k for k in DECODE_CANCEL_STEPS)]:
                name = f"cancel-{path}-r{rank}-p{poll}"
                tasks.append(
                    {"request": request(name, CANCEL_PROMPT, path), "cancel_rank": rank, "cancel_at_poll": poll}
                )
                # Short: it proves the group is reusable (a full prefill, then decode steps).
                tasks.append({"request": request(f"{name}-next", CANCEL_PROMPT, max_tokens=NEXT_MAX_TOKENS)})
    return tasks


def reference_tasks() -> list[dict[str, Any]]:
    """mlx-lm's own stream_generate, for the callbacks and tokens to match (1 rank only)."""

    def ref(ref_id: str, length: int, step: int) -> dict[str, Any]:
        prompt = synthetic_prompt(length)
        return {
            "kind": "mlx_reference",
            "ref_id": ref_id,
            "prompt_token_ids": prompt,
            "max_tokens": MAX_TOKENS,
            "step": step,
        }

    return [*(ref(f"ref-len{n}", n, CHUNK) for n in LENGTHS), ref("ref-wedge23", 23, DEFAULT_STEP)]


def sweep_job(world: int, ranges: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    from runner.engine.plan import even_split

    tasks = sweep_tasks(world) + (reference_tasks() if world == 1 else [])
    return {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": ranges or even_split(8, world),
        "settings": {"prefill_step_size": step_for(world)},
        "warmup": True,
        "tasks": tasks,
    }


def by_task(results: list[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    """Per rank: task_id -> outcome (mlx references keyed ref<len>-<step>)."""
    indexed = []
    for rank_result in results:
        assert "results" in rank_result, rank_result
        table = {}
        for outcome in rank_result["results"]:
            key = outcome["ref_id"] if outcome.get("kind") == "mlx_reference" else outcome["task_id"]
            table[key] = outcome
        indexed.append(table)
    return indexed


@functools.cache
def sweep_results(world: int, ranges: tuple[tuple[int, int], ...] | None = None) -> list[dict[str, dict[str, Any]]]:
    job = sweep_job(world, list(ranges) if ranges else None)
    return by_task(run_group(job, world, deadline_s=150))


def expected_path(length: int, world: int, path: str, step: int) -> str:
    return choose_path(length, step, world, path)  # type: ignore[arg-type]


def run_tiny_group(world: int, tasks: list[dict[str, Any]], settings: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """`tasks` run in order on one warmed-up group of `world` ranks over the tiny model's 8 layers,
    split evenly; per rank, its results in order (every rank must have finished)."""
    from runner.engine.plan import even_split

    job = {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": even_split(8, world),
        "settings": settings,
        "warmup": True,
        "tasks": tasks,
    }
    ranks = run_group(job, world, deadline_s=200)
    for rank in ranks:
        assert "results" in rank, rank
    return [rank["results"] for rank in ranks]


def served_alone(engine: Engine, request: GenerationRequest, sink: RunnerSink | None = None) -> GenerationOutcome:
    """`request` served alone on a 1-rank engine, as `shoal generate` serves it (a batch of one:
    `runner.engine.alone`); its outcome (a failure fails the test with its error)."""
    from runner.engine.alone import alone_batch, serve_alone
    from runner.engine.batch_streams import Admission
    from runner.engine.protocols import NeverCancelled, NullSink, PhaseTracker

    admission = Admission(request.task_id, request, NeverCancelled(), sink or NullSink())
    ended = serve_alone(alone_batch(engine, PhaseTracker()), admission)
    assert ended.outcome is not None, ended.error
    return ended.outcome
