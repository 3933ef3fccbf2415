"""A real cluster in subprocesses, for end-to-end tests and benchmarks: `shoal up`, or its services.

Every process runs in its own session and is killed (with its whole group) at the end, so a
failed test never leaves runners or nats-servers behind.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import httpx
import msgspec
import openai

from bench.tiny_seed import seed_tiny
from eventlog.endpoint import NatsEndpoint
from eventlog.export import read_export
from events.catalogue import ChunkGenerated, PrefillProgress
from events.codec import ExportRecord

READY = re.compile(r"shoal: ready: instance (\S+)")
_ACCESS_GET = re.compile(r"access_log:.* - GET ")


def free_ring_base_port() -> int:
    """A ring port range of this cluster's own (the master takes the lowest free port at or above
    it per host), so clusters started side by side on one machine never share a ring port. It lies
    below the kernel's ephemeral range: a port in it can be taken by any outgoing connection (a
    NATS client's, say) between this check and the ring's bind, and then held for good."""
    ephemeral_low = _lowest_ephemeral_port()
    for _ in range(100):
        base = random.randrange(10_000, max(ephemeral_low - 16, 10_016), 16)
        if all(_bindable(port) for port in range(base, base + 16)):
            return base
    raise RuntimeError("no free block of 16 ports for a ring")


def _lowest_ephemeral_port() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def shoal_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", *args]


class Proc:
    """One shoal process in its own session, stderr to a file, stdout scanned for lines."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.stdout_path = log_dir / f"{name}.out"
        self.stderr_path = log_dir / f"{name}.err"
        self.process = subprocess.Popen(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.stdout_path.open("wb"),
            stderr=self.stderr_path.open("wb"),
            start_new_session=True,
        )

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first match of `pattern` in what the process printed (its stdout)."""
        return self._wait_in(self.stdout_path, "line", pattern, timeout)

    def wait_for_log_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first match of `pattern` in the process's log (its stderr)."""
        return self._wait_in(self.stderr_path, "log line", pattern, timeout)

    def _wait_in(self, path: Path, what: str, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = pattern.search(path.read_text(errors="replace"))
            if found:
                return found
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: no {what} matching {pattern.pattern!r} within {timeout}s:\n{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        return (self.stdout_path.read_text(errors="replace") + self.stderr_path.read_text(errors="replace"))[-chars:]

    def stop(self, sig: int = signal.SIGINT, grace: float = 20.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.process.pid)
        return self.process.returncode


def _cmdlines() -> list[tuple[Path, list[str]]]:
    """(/proc/<pid>/cmdline, its arguments) of every process we can read."""
    found: list[tuple[Path, list[str]]] = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args and args[0]:
            found.append((cmdline, args))
    return found


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def runner_log_tails(data_dir: Path, newest: int, chars: int = 2000) -> list[str]:
    """The end of the `newest` runner log files of a cluster (`<data_dir>/runner-logs/<node>/...`)."""
    logs = sorted((data_dir / "runner-logs").glob("*/*.log"), key=lambda f: f.stat().st_mtime)
    return [f"--- runner {f.parent.name}/{f.name}\n{f.read_text(errors='replace')[-chars:]}" for f in logs[-newest:]]


def setting_env(settings: Mapping[str, str]) -> dict[str, str]:
    """Settings as the environment `shoal` reads them (`max_batch` -> `SHOAL_MAX_BATCH`)."""
    return {f"SHOAL_{key.upper()}": value for key, value in settings.items()}


class Cluster:
    """`shoal up` with free ports and a private data dir."""

    def __init__(self, root: Path, *, workers: int = 2, env: dict[str, str] | None = None, **settings: str) -> None:
        self.root = root
        self.nats_port = free_port()
        self.api_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.api_port}"
        self.env = {**os.environ, "SHOAL_DATA_DIR": str(root / "data"), **(env or {})}
        self.env.setdefault("SHOAL_RING_BASE_PORT", str(free_ring_base_port()))
        # A pipeline over every worker, as these clusters were measured and tested before placement
        # chose the fewest nodes; a test of placement itself sets its own.
        self.env.setdefault("SHOAL_MIN_NODES_PER_INSTANCE", str(workers))
        self.env.update(setting_env(settings))
        if "tiny" in self.env.get("SHOAL_MODELS", "tiny").split(","):
            seed_tiny(Path(self.env["SHOAL_DATA_DIR"]))  # not built again by every start (bench/tiny_seed.py)
        scheme = "tls" if self.env.get("SHOAL_NATS_TLS_CERT") else "nats"  # the embedded server serves TLS then
        self.nats_url = f"{scheme}://127.0.0.1:{self.nats_port}"
        argv = shoal_argv(
            "up", "--workers", str(workers), "--nats-port", str(self.nats_port), "--port", str(self.api_port)
        )
        self.up = Proc("up", argv, self.env, root)
        self.instance_id = ""

    def wait_ready(self, timeout: float = 120.0) -> Cluster:
        self.instance_id = self.up.wait_for_line(READY, timeout).group(1)
        return self

    def client(self, timeout: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="shoal", timeout=timeout, max_retries=0)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30.0)

    def admin_endpoint(self) -> NatsEndpoint:
        """This cluster's NATS as the operator identity `shoal up` made in its data dir (its NATS
        admits no one else), with the TLS files of its environment."""
        from services.config import resolve_config
        from services.credentials import endpoint_for
        from services.nats_permissions import Identity

        admin = endpoint_for(resolve_config(env=self.env).config, Identity("admin"))
        return msgspec.structs.replace(admin, url=self.nats_url)

    def runner_pids(self) -> dict[tuple[str, int], int]:
        """(instance, rank) -> pid of the runner processes of this cluster."""
        pids: dict[tuple[str, int], int] = {}
        for cmdline, args in _cmdlines():
            if "runner.service.main" not in args or self.nats_url not in args:
                continue
            instance = args[args.index("--instance") + 1]
            rank = int(args[args.index("--rank") + 1])
            pids[(instance, rank)] = int(cmdline.parent.name)
        return pids

    def tails(self, newest_runners: int = 4) -> str:
        """The end of the `newest_runners` runner logs and of `shoal up`'s output (last: nearest the
        end of a truncated report), without its access-log lines for GETs (a test polling /metrics
        writes twenty a second): what a failed test's reader needs, as CI keeps no files."""
        output = self.up.stdout_path.read_text(errors="replace") + self.up.stderr_path.read_text(errors="replace")
        runners = runner_log_tails(self.root / "data", newest_runners)
        return "\n".join([*runners, f"--- {self.up.name}", "\n".join(gets_collapsed(output.splitlines()))[-6000:]])

    def story(self, last: int = 40) -> str:
        """The log's last `last` events other than tokens and prefill progress, one line each (when,
        what, about which task or instance, from whom): what happened in the order the cluster
        agreed on, which no process's log shows whole."""
        path = self.root / "story.jsonl"
        argv = shoal_argv("events", "export", "-o", str(path))
        env = {**self.env, "SHOAL_NATS_URL": self.nats_url}  # its data dir: the admin identity
        try:
            exported = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return "(the log could not be exported within 60 s)"
        if exported.returncode != 0:
            return f"(the log could not be exported: {exported.stderr[-400:]})"
        told = [story_line(r) for r in read_export(path) if r.stream == "events" and not _is_progress(r.event)]
        return "\n".join(told[-last:])

    def stop(self) -> None:
        """Stop every process; when called while an exception is raised (a test's `finally`), first
        print the processes' tails and the log's story to stderr, which pytest shows beside the
        failure."""
        if sys.exc_info()[1] is not None:
            print(f"cluster logs at the failure:\n{self.tails()}\n--- the log\n{self.story()}", file=sys.stderr)
        self.up.stop()
        for pid in self.runner_pids().values():
            kill_group(pid)
        for pid in self.nats_pids():  # only left if `shoal up` died without stopping it
            kill_group(pid)

    def nats_pids(self) -> list[int]:
        port = str(self.nats_port)
        return [int(c.parent.name) for c, args in _cmdlines() if "nats-server" in args[0] and port in args]


def gets_collapsed(lines: Sequence[str]) -> list[str]:
    """`lines` of a log with each run of access-log lines for GETs (a test polling /metrics writes
    twenty a second) told in one line: how many, from when to when, and the longest time between
    two of them, which shows a process that stopped answering."""
    told: list[str] = []
    run: list[str] = []

    def tell_run() -> None:
        if run:
            known = [stamp for line in run if (stamp := _stamp_seconds(line)) is not None]
            gap = max((b - a for a, b in itertools.pairwise(known)), default=0.0)
            first, last = run[0][11:23], run[-1][11:23]
            told.append(f"[{len(run)} GET requests {first}..{last}, longest gap {gap:.1f}s]")
            run.clear()

    for line in lines:
        if _ACCESS_GET.search(line):
            run.append(line)
            continue
        tell_run()
        told.append(line)
    tell_run()
    return told


def _stamp_seconds(line: str) -> float | None:
    """Seconds of the day of a loguru line's `YYYY-MM-DD HH:MM:SS.mmm` stamp; None if it has none."""
    match = _LOG_STAMP.match(line)
    if match is None:
        return None
    hours, minutes, seconds = match.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


_LOG_STAMP = re.compile(r"\d{4}-\d\d-\d\d (\d\d):(\d\d):(\d\d\.\d+)")


def story_line(record: ExportRecord) -> str:
    """`record` as one line: its seq, wall time (UTC), kind, the ids it is about, its origin."""
    event = record.event
    at = datetime.fromtimestamp(event.env.wall_time / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3]
    about = [f"{name}={value}" for name in STORY_FIELDS if (value := getattr(event, name, None)) is not None]
    origin = event.env.origin
    who = "/".join(str(part) for part in (origin.service, origin.node, origin.rank) if part not in ("", None))
    return f"{record.seq} {at} {type(event).__name__} {' '.join(about)} <- {who}"[:240]


STORY_FIELDS = ("task_id", "instance_id", "node_id", "model", "status", "reason", "error")


def _is_progress(event: object) -> bool:
    return isinstance(event, ChunkGenerated | PrefillProgress)


_PROMPT_WORDS = ("river", "stone", "cloud", "amber", "violet", "north", "quiet", "swift", "lantern", "maple")


def long_prompt(words: int) -> str:
    """Varied text of `words` words (the tiny tokenizer spends ~5 tokens on each)."""
    return " ".join(_PROMPT_WORDS[(i * 7 + i // 3) % len(_PROMPT_WORDS)] for i in range(words))
