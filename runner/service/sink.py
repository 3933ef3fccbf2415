"""RunnerSink -> events: what the engine reports becomes PrefillStarted/Progress and ChunkGenerated."""

from __future__ import annotations

from typing import Protocol

from events.catalogue import (
    ChunkGenerated,
    LogEvent,
    PrefillProgress,
    PrefillStarted,
    TelemetryEvent,
)
from events.ids import TaskId
from events.logprobs import TokenLogprob
from events.stamp import Stamper
from events.vocabulary import PrefillPath


class Publisher(Protocol):
    def publish(self, event: LogEvent | TelemetryEvent) -> None: ...


class LogSink:
    """Publishes the engine's reports for one rank. Token chunks are published as they come:
    the engine already coalesces them between cancel polls."""

    def __init__(self, publisher: Publisher, stamper: Stamper, rank: int) -> None:
        self._publisher = publisher
        self._stamper = stamper
        self._rank = rank

    def prefill_started(
        self, task_id: str, path: PrefillPath, prompt_tokens: int, chunks: int, step: int, cached_tokens: int = 0
    ) -> None:
        self._publisher.publish(
            PrefillStarted(
                env=self._stamper.stamp(),
                task_id=TaskId(task_id),
                rank=self._rank,
                path=path,
                prompt_tokens=prompt_tokens,
                chunks=chunks,
                step=step,
                cached_tokens=cached_tokens,
            )
        )

    def prefill_progress(self, task_id: str, processed: int, total: int, iteration: int) -> None:
        self._publisher.publish(
            PrefillProgress(
                env=self._stamper.stamp(),
                task_id=TaskId(task_id),
                rank=self._rank,
                processed=processed,
                total=total,
                iteration=iteration,
            )
        )

    def tokens(
        self,
        task_id: str,
        index: int,
        text: str,
        token_ids: list[int],
        logprobs: list[TokenLogprob] | None = None,
        choice: int = 0,
    ) -> None:
        self._publisher.publish(
            ChunkGenerated(
                env=self._stamper.stamp(),
                task_id=TaskId(task_id),
                index=index,
                text=text,
                token_ids=token_ids,
                logprobs=logprobs,
                choice=choice,
            )
        )
