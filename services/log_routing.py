"""Where a shoal process's log lines go (`configure_logging`), and the standard-library loggers of the libraries a shoal process runs (uvicorn, nats-py,
huggingface_hub) routed into loguru, so every line a process writes goes through one sink in one
format (`log_format`: text, or one JSON object a line with loguru's serializer)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from loguru import logger

from services.config import ShoalConfig

# The libraries whose std loggers a shoal process meets: the API's server, the NATS client, the Hub.
ROUTED_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "nats", "huggingface_hub")


class ToLoguru(logging.Handler):
    """A std `logging` handler that hands each record to loguru at its level, with the caller's
    frame (not logging's) and the std logger's name bound as `std_logger`."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        frame, depth = logging.currentframe(), 0
        while frame is not None and (depth == 0 or frame.f_code.co_filename == logging.__file__):
            frame, depth = frame.f_back, depth + 1
        routed = logger.opt(depth=depth, exception=record.exc_info).bind(std_logger=record.name)
        routed.log(level, record.getMessage())


def route_std_logging() -> None:
    """Send the routed libraries' records to loguru and nowhere else (not to their own handlers,
    nor to the root logger's). Their levels stay theirs (uvicorn's is set by its `log_level`)."""
    for name in ROUTED_LOGGERS:
        std = logging.getLogger(name)
        std.handlers = [ToLoguru()]
        std.propagate = False


def import_transformers() -> Any:
    """transformers, its logger routed as the others: on import it adds a stderr handler of its own
    (then taken off here). Its one line at import, an advisory that PyTorch is missing, is turned
    off unless the environment says otherwise: shoal uses only its tokenizers, which need none."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import transformers
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_default_handler()
    std = logging.getLogger("transformers")
    std.handlers = [ToLoguru()]
    std.propagate = False
    return transformers


def configure_logging(config: ShoalConfig) -> None:
    """Send loguru's output to stderr at `log_level`, as text or JSON lines (`log_format`), with the
    std loggers of uvicorn, nats-py and huggingface_hub routed through the same sink (called by a
    command's handler, never at import)."""

    def to_stderr(message: str) -> None:  # looked up per message: survives sys.stderr being swapped
        sys.stderr.write(message)

    logger.remove()
    logger.add(to_stderr, level=config.log_level, serialize=config.log_format == "json")
    route_std_logging()
