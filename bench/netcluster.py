"""A shoal cluster across hosts (`bench/hosts.py`): three NATS servers in a JetStream
cluster (R3 streams), each in a host of its own; the master(s) and the API on a `control` host;
each worker on its own host, announcing its own address, so the ring between ranks crosses veth
links. Every service is the standalone command an operator runs on a real host, configured the
way the README says (env: the NATS URLs of all three servers, this host's credentials directory
from `shoal nats credentials`)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import msgspec
import nats.errors
import nats.js.errors

from bench.cluster import Proc, runner_log_tails, shoal_argv
from bench.hosts import Host, Network
from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog, LogError
from eventlog.streams import LEASE_BUCKET, MASTER_LEASE_KEY
from events.catalogue import LogEvent, NodeJoined
from services.config import log_settings, resolve_config
from services.credentials import cluster_config_name, endpoint_for, write_bundle
from services.master.lease import LeaseRecord
from services.nats import find_nats_server, read_info
from services.nats_permissions import Identity

NATS_CLIENT_PORT, NATS_ROUTE_PORT, API_PORT = 4222, 6222, 8000
# Short deadlines keep the fault tests fast: a silent node is timed out after 6 s, a task without
# progress fails after 12 s; small prefill steps make many prefill iterations of a long prompt.
# The API listens on the control host's address, not loopback: it refuses to without a key.
API_KEY = "netns-test-key-0123456789"
# nats-server's log line when it becomes the JetStream metadata leader, with its timestamp
META_LEADER_LINE = re.compile(
    r"(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) \[INF\] Self is new JetStream cluster metadata leader"
)
FAST_SETTINGS = {"prefill_step_size": "64", "task_stall_seconds": "12", "node_timeout_seconds": "6"}


class NetCluster:
    """The cluster; `stop()` (always, from a finalizer) ends every process and removes every host."""

    def __init__(
        self,
        root: Path,
        *,
        workers: int = 2,
        masters: int = 1,
        settings: Mapping[str, str] | None = None,
        worker_settings: Mapping[int, Mapping[str, str]] | None = None,
        start_workers: int | None = None,
        host_env: Mapping[str, Mapping[str, str]] | None = None,
        store_bytes: int | None = None,
    ) -> None:
        """`settings`: more SHOAL_* settings for every service (`{"models": "a,b"}`);
        `worker_settings`: per worker index (`{0: {"node_memory_bytes": "..."}}`); `start_workers`:
        how many workers start with the cluster (the others join later, `start_worker`);
        `host_env`: more environment for every process on a host, by host name; `store_bytes`:
        each NATS server's store on a tmpfs of its own of this size (needs root), so one can fill up."""
        self.root = root
        self.host_env = {name: dict(values) for name, values in (host_env or {}).items()}
        self.store_bytes = store_bytes
        self.mounts: list[Path] = []
        self.settings = dict(settings or {})
        self.worker_settings = {index: dict(values) for index, values in (worker_settings or {}).items()}
        self.start_workers = workers if start_workers is None else start_workers
        self.net = Network()
        self.procs: dict[str, Proc] = {}
        self.master_hosts: list[Host] = []  # the hosts of masters but the first (which is on `control`)
        self.commands: dict[str, tuple[Host, tuple[str, ...]]] = {}  # how each service was started
        try:
            self._start(workers, masters)
        except BaseException:
            self.stop()
            raise

    def _start(self, workers: int, masters: int) -> None:
        nats_hosts = [self.net.add(f"nats{i}") for i in range(3)]
        self.control = self.net.add("control")
        self.workers = [self.net.add(f"w{i}") for i in range(workers)]
        routes = [f"{h.address}:{NATS_ROUTE_PORT}" for h in nats_hosts]
        self.credentials = write_bundle(self.root / "credentials", [w.name for w in self.workers], routes)
        self.nats_hosts = nats_hosts
        for index in range(3):
            self.start_nats(index)
        self.nats_url = ",".join(f"nats://{h.address}:{NATS_CLIENT_PORT}" for h in nats_hosts)
        self.base_url = f"http://{self.control.address}:{API_PORT}"
        self.env = {
            **os.environ,
            "SHOAL_DATA_DIR": str(self.root / "data"),  # the tiny model's cache, shared like a model volume
            "SHOAL_NATS_URL": self.nats_url,
            "SHOAL_STREAM_REPLICAS": "3",
            "SHOAL_API_HOST": self.control.address,
            "SHOAL_API_PORT": str(API_PORT),
            "SHOAL_API_KEYS": f"{API_KEY}:admin",
            "SHOAL_MIN_NODES_PER_INSTANCE": str(workers),  # a pipeline across the hosts: what the faults cut
            **{f"SHOAL_{k.upper()}": v for k, v in {**FAST_SETTINGS, **self.settings}.items()},
        }
        self._wait_nats()
        asyncio.run(self._create_streams())
        for worker in self.workers[: self.start_workers]:
            self.start_worker(worker)
        # A standalone master places the model on the nodes up when it decides: every worker joins
        # first, so the instance spans every worker host.
        asyncio.run(self._wait_joined(self.start_workers))
        for index in range(masters):
            self.start_master(index)
        self.start_service(self.control, "api", "api")

    # --- processes -------------------------------------------------------------------------

    def env_of(self, host: Host) -> dict[str, str]:
        directory = self.credentials["control" if host.name == "control" or host in self.master_hosts else host.name]
        own = self.worker_settings.get(self.workers.index(host), {}) if host in self.workers else {}
        return {
            **self.env,
            "SHOAL_NATS_CREDENTIALS_DIR": str(directory),
            **{f"SHOAL_{k.upper()}": v for k, v in own.items()},
            **self.host_env.get(host.name, {}),
        }

    def start_worker(self, worker: Host) -> Proc:
        return self.start_service(worker, worker.name, "worker", "--node-id", worker.name, "--host", worker.address)

    def start_service(self, host: Host, name: str, *args: str) -> Proc:
        self.commands[name] = (host, args)
        self.procs[name] = Proc(name, host.argv(*shoal_argv(*args)), self.env_of(host), self.root)
        return self.procs[name]

    def restart_all(self) -> None:
        """What an operator does when the cluster did not heal itself: start any NATS server that
        died, and restart every shoal service (a restarted worker joins afresh)."""
        self.signal_nats(signal.SIGCONT)
        for index in range(3):
            if self.procs[f"nats{index}"].process.poll() is not None:
                self.start_nats(index)
        for name in self.commands:
            self.procs[name].stop(signal.SIGINT, grace=2)
        joined = self.count_on_log(NodeJoined)
        workers = {worker.name for worker in self.workers}
        for name, (host, args) in list(self.commands.items()):
            if name in workers:
                self.start_service(host, name, *args)
        asyncio.run(self._wait_joined(joined + len(workers)))  # then the master places across them all
        for name, (host, args) in list(self.commands.items()):
            if name not in workers:
                self.start_service(host, name, *args)

    def start_master(self, index: int) -> Proc:
        """Master 0 on the control host; each other one on a host of its own (`m<index>`, the
        control host's credentials), so partitioning the host of one master is a real test."""
        host = self.control if index == 0 else self.net.hosts.get(f"m{index}") or self.net.add(f"m{index}")
        if host is not self.control:
            self.master_hosts.append(host)
        return self.start_service(host, f"master{index}", "master")

    def lease_holder(self) -> str:
        """Which master (`master<i>`) holds the lease now, by the pid in the holder's name ('' if none)."""

        async def holder() -> str:
            log = await EventLog.connect(self.admin_endpoint(), ensure=False)
            try:
                js = log._js  # pyright: ignore[reportPrivateUsage]
                entry = await js.get_last_msg(
                    f"KV_{LEASE_BUCKET}", f"$KV.{LEASE_BUCKET}.{MASTER_LEASE_KEY}"
                )  # the leader's
                return msgspec.json.decode(entry.data or b"", type=LeaseRecord).holder if entry.data else ""
            except nats.js.errors.NotFoundError:
                return ""
            finally:
                await log.close()

        pid = asyncio.run(holder()).rpartition("-")[2]
        names = [n for n, p in self.procs.items() if n.startswith("master") and str(p.process.pid) == pid]
        return names[0] if names else ""

    def store_of(self, index: int) -> Path:
        return self.root / f"nats{index}-store"

    def start_nats(self, index: int) -> Proc:
        host = self.nats_hosts[index]
        store = self.store_of(index)
        if self.store_bytes is not None and store not in self.mounts:
            store.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.store_bytes}", "tmpfs", str(store)], check=True)
            self.mounts.append(store)
        config = self.credentials["nats-server"] / cluster_config_name(index)
        argv = [
            find_nats_server(),
            "--server_name",
            f"nats-{index}",
            "--addr",
            host.address,
            "--port",
            str(NATS_CLIENT_PORT),
            "--jetstream",
            "--store_dir",
            str(store),
            "--config",
            str(config),
        ]
        env = {**os.environ, **self.host_env.get(host.name, {})}
        self.procs[f"nats{index}"] = Proc(f"nats{index}", host.argv(*argv), env, self.root)
        return self.procs[f"nats{index}"]

    def signal_nats(self, sig: int) -> None:
        for index in range(3):
            self.procs[f"nats{index}"].process.send_signal(sig)

    def _wait_nats(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(read_info(h.address, NATS_CLIENT_PORT) for h in self.nats_hosts):
            if time.monotonic() > deadline:
                raise TimeoutError("NATS servers did not start:\n" + self.tails("nats"))
            time.sleep(0.1)

    def admin_endpoint(self) -> NatsEndpoint:
        config = resolve_config(env={**self.env, "SHOAL_NATS_CREDENTIALS_DIR": str(self.credentials["control"])})
        return msgspec.structs.replace(endpoint_for(config.config, Identity("admin")), url=self.nats_url)

    async def _create_streams(self, timeout: float = 40.0) -> None:
        """As the admin, once: JetStream accepts streams only once the cluster elected a meta leader."""
        config = resolve_config(env=self.env).config
        deadline = time.monotonic() + timeout
        while True:
            try:
                log = await EventLog.connect(self.admin_endpoint(), log_settings(config), wait_seconds=5)
                await log.close()
                return
            except (LogError, nats.js.errors.Error, nats.errors.Error, TimeoutError):  # no meta leader yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    def events_leader(self) -> int:
        """Which NATS server (index) leads the SHOAL_EVENTS stream now."""

        async def leader() -> str:
            log = await EventLog.connect(self.admin_endpoint(), ensure=False)
            try:
                info = await log._js.stream_info("SHOAL_EVENTS")  # pyright: ignore[reportPrivateUsage]
                return info.cluster.leader if info.cluster is not None and info.cluster.leader else ""
            finally:
                await log.close()

        name = asyncio.run(leader())
        return int(name.removeprefix("nats-")) if name.startswith("nats-") else 0

    def wait_nats_whole(self, timeout: float = 60.0) -> NetCluster:
        """Until every stream has a leader and each of its replicas is current: a server started
        again has caught up from its peers. A test that kills one server of three must not find
        another still behind, which would be two faults at once (no quorum until it catches up)."""
        deadline = time.monotonic() + timeout
        while behind := asyncio.run(self._streams_behind()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"NATS streams not whole after {timeout}s: {behind}\n{self.tails('nats')}")
            time.sleep(0.5)
        return self

    async def _streams_behind(self) -> list[str]:
        """Why the streams are not whole yet (empty: they are)."""
        try:
            log = await EventLog.connect(self.admin_endpoint(), ensure=False, wait_seconds=3)
        except (LogError, nats.errors.Error, OSError, TimeoutError) as exc:
            return [f"cannot connect: {exc}"]
        try:
            infos = await log._js.streams_info()  # pyright: ignore[reportPrivateUsage]
        except (nats.js.errors.Error, nats.errors.Error, TimeoutError) as exc:
            return [f"cannot list the streams: {exc}"]
        finally:
            await log.close()
        behind: list[str] = []
        for info in infos:
            cluster, name = info.cluster, info.config.name
            replicas = [] if cluster is None else cluster.replicas or []
            if cluster is None or not cluster.leader:
                behind.append(f"{name}: no leader")
            elif len(replicas) < (info.config.num_replicas or 1) - 1 or any(
                p.offline or not p.current for p in replicas
            ):
                peers = ", ".join(f"{p.name} current={p.current} offline={p.offline}" for p in replicas)
                behind.append(f"{name}: leader {cluster.leader}, replicas {peers or 'none'}")
        return behind

    def meta_leader(self) -> int:
        """Which NATS server (index) leads the JetStream cluster's metadata now: the newest
        "Self is new JetStream cluster metadata leader" line among the servers' logs (the API
        that reports it needs the system account, which the cluster's identities do not hold)."""
        newest = ("", 0)
        for index in range(len(self.nats_hosts)):
            text = self.procs[f"nats{index}"].stderr_path.read_text(errors="replace")
            for found in META_LEADER_LINE.finditer(text):
                newest = max(newest, (found.group(1), index))
        return newest[1]

    def count_on_log(self, kind: type[LogEvent]) -> int:
        """How many events of `kind` the log holds."""
        return asyncio.run(self._count(kind))

    async def _count(self, kind: type[LogEvent]) -> int:
        log = await EventLog.connect(self.admin_endpoint(), ensure=False)
        try:
            return sum([isinstance(event, kind) async for _, event in log.replay()])
        finally:
            await log.close()

    async def _wait_joined(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while await self._count(NodeJoined) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the log has fewer than {count} NodeJoined after {timeout}s:\n{self.tails('w')}")
            await asyncio.sleep(0.25)

    # --- state -----------------------------------------------------------------------------

    def http(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers={"authorization": f"Bearer {API_KEY}"}, timeout=timeout)

    def health(self) -> dict[str, object]:
        try:
            return httpx.get(f"{self.base_url}/healthz", timeout=3).json()
        except (httpx.HTTPError, ValueError):
            return {}

    def runs_a_runner(self, host: Host) -> bool:
        """Whether a runner process lives on `host` (the processes in its namespace, by command line)."""
        for pid in self.net.pids(host):
            try:
                if b"runner.service.main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
        return False

    def serving_hosts(self) -> list[Host]:
        """The worker hosts a runner process lives on now."""
        return [worker for worker in self.workers if self.runs_a_runner(worker)]

    def serving(self, *, across_hosts: bool = True) -> bool:
        """A ready instance and every worker node up; with `across_hosts`, a rank on every worker
        host (so the ring crosses the links: an instance placed while a host was cut off holds
        only the others, and the master does not move a serving instance when a node rejoins)."""
        health = self.health()
        return (
            int(health.get("ready_instances", 0)) >= 1  # pyright: ignore[reportArgumentType]
            and health.get("nodes_up") == len(self.workers)
            and (not across_hosts or len(self.serving_hosts()) == len(self.workers))
        )

    def wait_ready(self, timeout: float = 120.0, *, across_hosts: bool = True) -> NetCluster:
        deadline = time.monotonic() + timeout
        while not self.serving(across_hosts=across_hosts):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"not serving (across_hosts={across_hosts}) within {timeout}s: {self.health()}\n{self.tails()}"
                )
            time.sleep(0.25)
        return self

    def tails(self, prefix: str = "") -> str:
        """The end of each process's output: the runners' first, then the masters', the API's and
        the workers', the NATS servers' last (a failed test's report is cut in its middle when
        long: what its reader needs most comes first)."""
        order = ("master", "api", "w", "nats")
        names = sorted(
            (n for n in self.procs if n.startswith(prefix)),
            key=lambda n: next((i for i, kind in enumerate(order) if n.startswith(kind)), len(order)),
        )
        services = [f"--- {n}\n{self.procs[n].tail(1500)}" for n in names if not n.startswith("nats")]
        servers = [f"--- {n}\n{self.procs[n].tail(1500)}" for n in names if n.startswith("nats")]
        return "\n".join([*(self.runner_tails() if not prefix else []), *services, *servers])

    def runner_tails(self, newest: int = 4) -> list[str]:
        """The end of the `newest` runner log files (`<data_dir>/runner-logs/<node>/...`)."""
        return runner_log_tails(self.root / "data", newest, chars=1500)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.process.poll() is None:
                proc.process.send_signal(signal.SIGCONT)  # a paused server must be able to die
        for name in sorted(self.procs, key=lambda n: n.startswith("nats")):  # services first, NATS last
            self.procs[name].stop(signal.SIGINT, grace=5)
        self.net.close()
        for store in self.mounts:
            subprocess.run(["umount", "-l", str(store)], check=False, capture_output=True, timeout=20)
        self.mounts.clear()
