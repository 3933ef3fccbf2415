"""Everything a request handler needs, built once by the API service and passed in (no globals)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import anyio
from loguru import logger
from prometheus_client import CollectorRegistry

from eventlog.log import EventLog
from events.catalogue import LogEvent, Origin, TaskCancelled
from events.ids import TaskId
from events.stamp import Stamper
from services.api.auth import ApiAccess
from services.api.hub import LogHub
from services.api.metrics import Metrics, metrics_registry
from services.api.prompt_lanes import PromptLanes
from services.api.prompts import PromptModel, load_prompt_model, model_tool_parser
from services.api.reasoning import ReasoningMarkers
from services.api.tool_parsers import ToolParser
from services.config import ResolvedConfig
from services.models import existing_model_dir, served_models


@dataclass
class ApiContext:
    log: EventLog
    hub: LogHub
    stamper: Stamper
    resolved: ResolvedConfig
    access: ApiAccess
    metrics: Metrics
    registry: CollectorRegistry  # what /metrics exposes: `metrics`, the State's gauges, the process
    served: list[str]
    # set when the API begins to stop: each request in flight cancels its task and tells its client
    # (`task_stream.run_task`), and a new one is refused with a 503, before the log closes
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    prompt_lanes: PromptLanes = field(default_factory=PromptLanes)  # where grammars are checked, prompts sized
    _prompt_models: dict[str, PromptModel | None] = field(default_factory=dict)  # by model, once loaded
    _prompt_loading: anyio.Lock = field(default_factory=anyio.Lock)  # one load at a time: see prompt_model

    @classmethod
    def on(cls, log: EventLog, resolved: ResolvedConfig, served: list[str], *, access: ApiAccess) -> ApiContext:
        """The context of an API on `log`, with its own hub (not yet running) and metrics."""
        metrics = Metrics()
        hub = LogHub(log, metrics, resolved.config.finished_tasks_kept, served)
        return cls(
            log=log,
            hub=hub,
            stamper=Stamper(Origin(service="api")),
            resolved=resolved,
            access=access,
            metrics=metrics,
            registry=metrics_registry(metrics, lambda: hub.state),
            served=served,
        )

    async def publish(self, event: LogEvent) -> int:
        seq = await self.log.append(event)
        self.metrics.events_published[type(event).__name__] += 1
        return seq

    async def cancel(self, task_id: TaskId, reason: str) -> int:
        event = TaskCancelled(env=self.stamper.stamp(), task_id=task_id, reason=reason)  # pyright: ignore[reportArgumentType]
        return await self.publish(event)

    async def prompt_model(self, model: str) -> PromptModel | None:
        """What prompts for `model` are checked against, loaded on first use: a model's directory
        may appear after the API starts (`tiny` is built by the first runner that needs it). The
        first requests of a burst all arrive before it is loaded: they wait for one load, rather
        than import transformers in several threads at once (its lazy imports then fail)."""
        if model in self._prompt_models:
            return self._prompt_models[model]
        async with self._prompt_loading:
            if model not in self._prompt_models:
                directory = await anyio.to_thread.run_sync(existing_model_dir, model)  # may look in the Hub cache
                if directory is None:
                    return None
                self._prompt_models[model] = await anyio.to_thread.run_sync(load_prompt_model, directory)
        return self._prompt_models[model]

    async def reasoning_markers(self, model: str) -> ReasoningMarkers | None:
        """The markers `model` thinks between (None: not a thinking model, or its tokenizer is not
        on this machine, so its reasoning stays in its answer)."""
        loaded = await self.prompt_model(model)
        return None if loaded is None else loaded.reasoning

    async def tool_parser(self, model: str) -> ToolParser | None:
        """The parser of `model`'s tool-call format (None: its template shows none shoal knows,
        so a call it writes stays in its content); see `prompts.model_tool_format`."""
        return model_tool_parser(await self.prompt_model(model))

    async def preload_prompt_models(self, every_seconds: float = 1.0, longest_wait_seconds: float = 10.0) -> None:
        """Until cancelled: load each served model's tokenizer as soon as its directory exists, so
        the first request does not pay for it (importing transformers and reading a tokenizer take
        a second or more: a first request to a ready 100M-parameter model took 1.5 s, the next 0.1 s).
        A model not found (no runner on this host built it) is looked for again less and less often,
        up to every `longest_wait_seconds`; one whose load fails does not hold up the others."""
        clock = asyncio.get_running_loop().time
        waits: dict[str, float] = {}
        due: dict[str, float] = {}
        while True:
            for model in self.known_models():
                if model in self._prompt_models or clock() < due.get(model, 0.0):
                    continue
                try:
                    await self.prompt_model(model)
                except Exception:
                    logger.exception("cannot load the tokenizer of {}; a request will try again", model)
                if model not in self._prompt_models:
                    waits[model] = min(longest_wait_seconds, 2 * waits.get(model, every_seconds / 2))
                    due[model] = clock() + waits[model]
            await asyncio.sleep(every_seconds)

    @property
    def loaded_prompt_models(self) -> tuple[str, ...]:
        """The models whose tokenizer (or absence of one) is known."""
        return tuple(self._prompt_models)

    def known_models(self) -> list[str]:
        return served_models(self.served, self.hub.state)
