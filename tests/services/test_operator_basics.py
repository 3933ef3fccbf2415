"""The pure parts of the operator's basics: why the API is not ready, the access line, and the std
loggers routed into loguru's sink."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from loguru import logger

from services.api.access_log import AccessRecord
from services.api.responses import Health
from services.api.routes import not_ready_reason
from services.log_routing import ROUTED_LOGGERS, route_std_logging


def _health(status: str, **fields: object) -> Health:
    base: dict[str, object] = {
        "status": status,
        "last_seq": 1,
        "nodes_up": 2,
        "ready_instances": 0,
        "log_caught_up": True,
    }
    return Health(**{**base, **fields})  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(
    ("health", "says"),
    [
        (_health("ok", ready_instances=1), ""),
        (_health("degraded", degraded="NATS connection lost"), "cannot follow the event log: NATS connection lost"),
        (_health("no_workers", nodes_up=0), "no worker node is up"),
        (_health("starting"), "no instance is ready yet (2 nodes up)"),
        (_health("model_unavailable", errors={"big": "not in the Hub cache"}), "big: not in the Hub cache"),
    ],
)
def test_not_ready_says_why(health: Health, says: str) -> None:
    reason = not_ready_reason(health)
    assert (says in reason) if says else reason == ""


def test_an_access_line_names_the_key_by_id_and_the_task() -> None:
    record = AccessRecord("POST", "messages", 200, "0123456789abcdef", "task_1", 12.34)
    assert record.line() == "POST messages 200 key=0123456789abcdef task=task_1 12.3 ms"
    assert AccessRecord("GET", "unmatched", 404, "", "", 0.5).line() == "GET unmatched 404 key=- task=- 0.5 ms"


@pytest.fixture
def std_loggers() -> Iterator[None]:
    """The routed loggers as they were, restored after the test (routing changes process state)."""
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate) for name in ROUTED_LOGGERS}
    try:
        yield
    finally:
        for name, (handlers, propagate) in saved.items():
            logging.getLogger(name).handlers = handlers
            logging.getLogger(name).propagate = propagate


@pytest.mark.usefixtures("std_loggers")
def test_uvicorn_nats_and_hub_records_go_through_the_loguru_sink_as_json() -> None:
    lines: list[str] = []
    sink = logger.add(lines.append, serialize=True, level="DEBUG")
    try:
        route_std_logging()
        for name in ("uvicorn.error", "nats", "huggingface_hub"):
            logging.getLogger(name).warning("from %s", name)
    finally:
        logger.remove(sink)
    records = [json.loads(line)["record"] for line in lines]
    assert [(r["message"], r["extra"]["std_logger"], r["level"]["name"]) for r in records] == [
        ("from uvicorn.error", "uvicorn.error", "WARNING"),
        ("from nats", "nats", "WARNING"),
        ("from huggingface_hub", "huggingface_hub", "WARNING"),
    ]
    assert records[0]["function"] == "test_uvicorn_nats_and_hub_records_go_through_the_loguru_sink_as_json"
