"""What the master's core asks of its model catalog, answered without blocking its event loop.

Reading a Hub model's `config.json` may mean a network fetch (and huggingface_hub retries a dead
endpoint for many seconds). Done inside the master's loop, that stalled its heartbeat reading and
its lease renewals, so a master could lose its lease while looking a model up, and lose it again
each time it took over. So the served models are looked up in a thread before any decision and
kept; a failed look-up is tried again in a thread every `retry_seconds`, from the tick loop. The
core's `facts_of` then only reads what was found. A model the log names for the first time (a
task's, an operator's load request) is added (`add`) and looked up before the core decides on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from services.master.capacity import ModelFacts
from services.master.core import ModelCatalog, UnknownModel

RETRY_SECONDS = 30.0


class LookedUpCatalog:
    def __init__(
        self,
        inner: ModelCatalog,
        models: Sequence[str],
        *,
        retry_seconds: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner, self.models = inner, list(dict.fromkeys(models))
        self.retry_seconds, self.clock = retry_seconds, clock
        self._found: dict[str, ModelFacts | UnknownModel] = {}
        self._tried_at: dict[str, float] = {}

    def facts_of(self, model: str) -> ModelFacts:
        found = self._found.get(model)
        if found is None:  # never looked up: the shell looks up each model the log names before deciding
            raise UnknownModel(f"model {model!r} was not looked up; known models: {', '.join(self.models)}")
        if isinstance(found, UnknownModel):
            raise found
        return found

    async def look_up(self, *, only_due: bool = False) -> None:
        """Look the models up in a thread: all of them, or only those whose last look-up failed
        `retry_seconds` ago or more."""
        for model in self.models:
            if only_due and not self._due(model):
                continue
            self._found[model] = await asyncio.to_thread(self._ask, model)
            self._tried_at[model] = self.clock()

    def _due(self, model: str) -> bool:
        found, tried = self._found.get(model), self._tried_at.get(model)
        return (
            found is None
            or tried is None
            or (isinstance(found, UnknownModel) and self.clock() - tried >= self.retry_seconds)
        )

    async def add(self, models: Sequence[str]) -> None:
        """Look up models the master learned of from the log (an operator's load request) before
        it decides on them; those known already are not looked up again."""
        new = [m for m in dict.fromkeys(models) if m not in self.models]
        self.models += new
        for model in new:
            self._found[model] = await asyncio.to_thread(self._ask, model)
            self._tried_at[model] = self.clock()

    def _ask(self, model: str) -> ModelFacts | UnknownModel:
        try:
            return self.inner.facts_of(model)
        except UnknownModel as exc:
            return exc
