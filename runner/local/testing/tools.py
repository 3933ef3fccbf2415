"""Test tooling: the cancel sources, sinks and references a test job may ask a local rank for (no MLX at import).

Job keys that select it, per task of a test job (`jobs.run_test_task`): `cancel_before_start_ranks`
(`FixedCancel`), `failing_cancel_rank` (`BrokenCancel`), `failing_sink_rank`
(`RecordingSink.fail_on_tokens`) and `"kind": "mlx_reference"` (`mlx_reference`). Every task of a
test job records its callbacks in a `RecordingSink`, returned with the rank's result for the tests
to compare. Killing or freezing a rank is not here: that is the fault injector both shells share
(`runner.flight.faults`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from events.logprobs import TokenLogprob


@dataclass(slots=True)
class BrokenCancel:
    """A cancel source whose backend is down (tests: the group must still agree)."""

    def is_cancelled(self, task_id: str) -> bool:
        raise ConnectionError("cancel subscription lost")


@dataclass(slots=True)
class FixedCancel:
    cancelled: bool

    def is_cancelled(self, task_id: str) -> bool:
        return self.cancelled


@dataclass(slots=True)
class RecordingSink:
    started: list[dict[str, object]] = field(default_factory=list)
    progress: list[tuple[int, int, int]] = field(default_factory=list)
    chunks: list[tuple[int, str, list[int]]] = field(default_factory=list)  # choice 0's
    # the other choices' chunks of a task of several (`GenerationRequest.n`): (choice, index, text, ids)
    choice_chunks: list[tuple[int, int, str, list[int]]] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of every chunk's tokens, in order
    fail_on_tokens: bool = False  # tests: a sink whose publisher broke mid-task

    def prefill_started(
        self, task_id: str, path: str, prompt_tokens: int, chunks: int, step: int, cached_tokens: int = 0
    ) -> None:
        self.started.append(
            {"path": path, "prompt_tokens": prompt_tokens, "chunks": chunks, "step": step, "cached": cached_tokens}
        )

    def prefill_progress(self, task_id: str, processed: int, total: int, iteration: int) -> None:
        self.progress.append((processed, total, iteration))

    def tokens(
        self,
        task_id: str,
        index: int,
        text: str,
        token_ids: list[int],
        logprobs: list[TokenLogprob] | None = None,
        choice: int = 0,
    ) -> None:
        if self.fail_on_tokens:
            raise ConnectionError("publisher closed")
        if choice:
            self.choice_chunks.append((choice, index, text, list(token_ids)))
            return
        self.chunks.append((index, text, list(token_ids)))
        self.logprobs.extend(logprobs or [])

    def choice_tokens(self, choice: int) -> list[int]:
        """Every token id of one choice, in order."""
        if choice == 0:
            return [i for _, _, ids in self.chunks for i in ids]
        return [i for c, _, _, ids in self.choice_chunks if c == choice for i in ids]


def mlx_reference(shard: Any, task: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm's own stream_generate on a 1-rank shard: the tokens and callbacks to match."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    callbacks: list[tuple[int, int]] = []
    tokens = []
    for response in stream_generate(
        shard.model,
        shard.tokenizer,
        mx.array(task["prompt_token_ids"]),
        max_tokens=task["max_tokens"],
        prefill_step_size=task["step"],
        prompt_progress_callback=lambda done, total: callbacks.append((done, total)),
    ):
        if response.finish_reason == "stop" and response.token in shard.tokenizer.eos_token_ids:
            break
        tokens.append(response.token)
    return {"kind": "mlx_reference", "ref_id": task.get("ref_id"), "token_ids": tokens, "progress": callbacks}


def slow_json_schema(alternatives: int) -> dict[str, Any]:
    """A JSON schema llguidance takes long to turn into a grammar, about linearly in `alternatives`
    (objects of bounded-integer alternatives; 400 here: ~0.35 s of checks, ~0.2 s more to compile a
    matcher): the slow grammar of the preparation tests and of `shoal bench batch`."""
    alternative = [{"type": "integer", "minimum": j} for j in range(30)]
    return {"anyOf": [{"type": "object", "properties": {f"k{i}": {"anyOf": alternative}}} for i in range(alternatives)]}
