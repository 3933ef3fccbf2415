"""Everything a request handler needs, built once by the API service and passed in (no globals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventlog.log import EventLog
from events.catalogue import LogEvent, Origin, TaskCancelled
from events.ids import TaskId
from events.stamp import Stamper
from services.api.auth import ApiAccess
from services.api.hub import LogHub
from services.api.metrics import Metrics
from services.config import ResolvedConfig
from services.models import served_models


@dataclass
class ApiContext:
    log: EventLog
    hub: LogHub
    stamper: Stamper
    resolved: ResolvedConfig
    access: ApiAccess
    metrics: Metrics
    served: list[str]
    tokenizer_files: dict[str, Path]  # model -> tokenizer.json, for prompt size checks
    _tokenizers: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def on(
        cls,
        log: EventLog,
        resolved: ResolvedConfig,
        served: list[str],
        tokenizer_files: dict[str, Path],
        *,
        access: ApiAccess,
    ) -> ApiContext:
        """The context of an API on `log`, with its own hub (not yet running) and metrics."""
        metrics = Metrics()
        return cls(
            log=log,
            hub=LogHub(log, metrics),
            stamper=Stamper(Origin(service="api")),
            resolved=resolved,
            access=access,
            metrics=metrics,
            served=served,
            tokenizer_files=tokenizer_files,
        )

    async def publish(self, event: LogEvent) -> int:
        seq = await self.log.append(event)
        self.metrics.events_published[type(event).__name__] += 1
        return seq

    async def cancel(self, task_id: TaskId, reason: str) -> int:
        event = TaskCancelled(env=self.stamper.stamp(), task_id=task_id, reason=reason)  # pyright: ignore[reportArgumentType]
        return await self.publish(event)

    def count_prompt_tokens(self, model: str, contents: list[str]) -> int:
        """Tokens of the messages' text with the model's tokenizer when known, else ~4 chars a token."""
        text = "\n".join(contents)
        path = self.tokenizer_files.get(model)
        if path is None or not path.exists():
            return len(text) // 4 + 1
        if model not in self._tokenizers:
            from tokenizers import Tokenizer

            self._tokenizers[model] = Tokenizer.from_file(str(path))
        return len(self._tokenizers[model].encode(text).ids)

    def known_models(self) -> list[str]:
        return served_models(self.served, self.hub.state)
