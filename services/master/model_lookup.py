"""What the master's core asks of its model catalog, answered without blocking its event loop.

Reading a Hub model's `config.json` may mean a network fetch (and huggingface_hub retries a dead
endpoint for many seconds). Done inside the master's loop, that stalled its heartbeat reading and
its lease renewals, so a master could lose its lease while looking a model up, and lose it again
each time it took over. So the served models are looked up in a thread before any decision and
kept; a failed look-up is tried again in a thread every `retry_seconds`, from the tick loop. The
core's `layers_of` then only reads what was found. A model not in `models` is asked of the inner
catalog directly: it must answer those without I/O (`LocalModelCatalog` refuses them by name).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

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
        self._found: dict[str, int | UnknownModel] = {}
        self._tried_at: dict[str, float] = {}

    def layers_of(self, model: str) -> int:
        found = self._found.get(model)
        if found is None:
            return self.inner.layers_of(model)
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

    def _ask(self, model: str) -> int | UnknownModel:
        try:
            return self.inner.layers_of(model)
        except UnknownModel as exc:
            return exc
