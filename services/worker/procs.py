"""Runner processes of one worker: spawn, watch, stop. Exit reports go through a callback; each
runner's stderr goes to its own bounded file (`runner_logs`) as well as the exit report's tail."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from loguru import logger

from services.config import is_secret_variable
from services.worker.plan import RunnerKey
from services.worker.runner_logs import RUNNER_LOGS_KEPT, BoundedLog, prune_runner_logs, runner_log_name

STDERR_TAIL_LINES = 30
STOP_GRACE_SECONDS = 3.0

ExitReport = Callable[[RunnerKey, int, str], Awaitable[None]]


def runner_argv(nats_url: str, key: RunnerKey, node_id: str) -> list[str]:
    """A rank's command line: who it is and where the log is, nothing else. Its settings come from
    the log (`InstancePlaced.settings`), so every rank of an instance runs with the same ones."""
    instance_id, rank = key
    return [
        "-m",
        "runner.service.main",
        "--nats-url",
        nats_url,
        "--instance",
        instance_id,
        "--rank",
        str(rank),
        "--node-id",
        node_id,
    ]


class RunnerProcess:
    def __init__(self, key: RunnerKey, process: asyncio.subprocess.Process, log: BoundedLog | None) -> None:
        self.key = key
        self.process = process
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.stopping = False
        self.log = log

    def stderr_tail(self) -> str:
        return "\n".join(self.tail)

    def keep(self, line: str) -> None:
        """One line of stderr: into the tail, and into the runner's file while it can be written."""
        self.tail.append(line)
        self.note(line)

    def note(self, line: str) -> None:
        """A line into the runner's file only (the worker's own remarks: when it started, how it ended)."""
        if self.log is None:
            return
        try:
            self.log.write_line(line)
        except OSError as error:  # a full disk costs the file, never the runner or the worker
            logger.warning("runner {} rank {}: stopped writing {}: {}", *self.key, self.log.path, error)
            self._close_log()

    def _close_log(self) -> None:
        if self.log is not None:
            try:
                self.log.close()
            except OSError:
                pass
            self.log = None

    def finish(self, code: int) -> None:
        self.note(f"# shoal worker: runner {self.key[0]} rank {self.key[1]} {describe_exit(code)}")
        self._close_log()


class RunnerProcesses:
    """Owns the runner processes; each gets a watcher task in the caller's task group."""

    def __init__(
        self, group: asyncio.TaskGroup, on_exit: ExitReport, *, log_dir: Path | None = None, log_bytes: int = 0
    ) -> None:
        """`log_dir`: where each runner's stderr file goes (None: nowhere, only the exit report's
        tail), each at most `log_bytes` with its rotated predecessor."""
        self._group = group
        self._on_exit = on_exit
        self._log_dir = log_dir
        self._log_bytes = log_bytes
        self.running: dict[RunnerKey, RunnerProcess] = {}
        self.ever_started: set[RunnerKey] = set()

    async def start(self, key: RunnerKey, argv: Sequence[str], env: dict[str, str]) -> None:
        self.ever_started.add(key)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # Ctrl-C at a terminal reaches the worker, which stops runners in order
        )
        runner = RunnerProcess(key, process, self._open_log(key))
        runner.note(f"# shoal worker: runner {key[0]} rank {key[1]} started, pid {process.pid}")
        self.running[key] = runner
        logger.info("started runner {} rank {} (pid {})", key[0], key[1], process.pid)
        self._group.create_task(self._watch(runner))

    def _open_log(self, key: RunnerKey) -> BoundedLog | None:
        if self._log_dir is None:
            return None
        try:
            prune_runner_logs(self._log_dir, RUNNER_LOGS_KEPT - 1)  # room for this one
            return BoundedLog(self._log_dir / runner_log_name(*key), self._log_bytes)
        except OSError as error:
            logger.warning("runner {} rank {}: no stderr file in {}: {}", *key, self._log_dir, error)
            return None

    async def stop(self, key: RunnerKey) -> None:
        runner = self.running.get(key)
        if runner is None:
            return
        runner.stopping = True
        await _terminate(runner.process)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(key) for key in list(self.running)))

    async def _watch(self, runner: RunnerProcess) -> None:
        assert runner.process.stderr is not None
        async for raw in runner.process.stderr:
            runner.keep(raw.decode(errors="replace").rstrip())
        code = await runner.process.wait()
        runner.finish(code)
        self.running.pop(runner.key, None)
        logger.info("runner {} rank {} exited with {}", runner.key[0], runner.key[1], code)
        if not runner.stopping:
            await self._on_exit(runner.key, code, runner.stderr_tail())


async def _terminate(process: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL: a rank blocked inside a collective never sees its stop flag."""
    if process.returncode is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), STOP_GRACE_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
    except ProcessLookupError:
        pass


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def child_env(extra: dict[str, str], inherited: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A runner's environment: the worker's, less its secret settings (a runner needs none, and a
    process's environment is readable by anything running as its user), plus `extra`."""
    env = {name: value for name, value in inherited.items() if not is_secret_variable(name)}
    env.update(extra)
    return env
