"""A runner whose worker died (even by SIGKILL) exits too, instead of holding its ring ports.

Nobody is left to report that exit, and the rank may hold events not yet on the log: the sampling
rank queues a task's terminal event when the task leaves the batch, so a rank that vanished at
once would leave a task every rank had ended with no end on the log (its client waits for the
watchdog's stall deadline, then sees it fail although its text was whole). So before it exits
the rank says on the log that it goes down with its worker, and hands over what it queued, within
`ORPHAN_FLUSH_SECONDS`: a log it cannot reach (the host cut off) never keeps it from exiting.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from loguru import logger

ORPHAN_EXIT = 3  # the status of a runner that outlived its worker (no worker reads it)
ORPHAN_FLUSH_SECONDS = 5.0  # what its last words may take: its queued events, then its own failure


class ExitWithParent:
    """Polls the parent's pid; when it changed (the worker is gone), runs `last_words` (set once
    the runner can publish) and exits, whatever `last_words` does, within the flush bound."""

    def __init__(
        self,
        poll_seconds: float = 1.0,
        *,
        flush_seconds: float = ORPHAN_FLUSH_SECONDS,
        exit_process: Callable[[int], object] = os._exit,
        parent_pid: Callable[[], int] = os.getppid,
    ) -> None:
        self.poll_seconds = poll_seconds
        self.flush_seconds = flush_seconds
        self._exit_process = exit_process
        self._parent_pid = parent_pid
        self.parent = parent_pid()
        self._last_words: Callable[[float], object] | None = None
        self._lock = threading.Lock()

    def before_exit(self, last_words: Callable[[float], object]) -> None:
        """What to do before exiting: given the seconds it may take."""
        with self._lock:
            self._last_words = last_words

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._watch, name="parent-watch", daemon=True)
        thread.start()
        return thread

    def _watch(self) -> None:
        while self._parent_pid() == self.parent:
            time.sleep(self.poll_seconds)
        self.orphaned()

    def orphaned(self) -> None:
        logger.error("the worker (pid {}) is gone: this runner exits too", self.parent)
        with self._lock:
            last_words = self._last_words
        if last_words is not None:
            done = threading.Event()
            speaker = threading.Thread(target=self._speak, args=(last_words, done), name="last-words", daemon=True)
            speaker.start()
            done.wait(self.flush_seconds + 1.0)  # a wedged publish never keeps the ports held
        self._exit_process(ORPHAN_EXIT)

    def _speak(self, last_words: Callable[[float], object], done: threading.Event) -> None:
        try:
            last_words(self.flush_seconds)
        except Exception:
            logger.exception("the runner's last words were not published")
        finally:
            done.set()
