"""Hosts on this machine: one Linux network namespace per host, each with its own address on a
private /24, all joined by veth pairs to one bridge in the root namespace.

The test process stays in the root namespace and reaches every host over the bridge (the API,
the NATS servers); the hosts reach each other only through it, so a link set down is a cable
pulled and a qdisc on a link is a slow or lossy wire. Addresses are on a 10.213.x.0/24 the run
picks unused; nothing is routed off the machine (no default route in any namespace).

Every name carries the creating process's id (`snet<pid hex>_`), so a run cleans up what an
earlier run killed before its finalizers left behind, and never touches another live run's hosts.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field

NAME_PREFIX = "snet"
_STALE = re.compile(rf"^{NAME_PREFIX}([0-9a-f]+)_")


class NetnsError(RuntimeError):
    """An `ip`/`tc` command failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _probe(suffix: str, *commands: list[str]) -> str | None:
    """Run `commands` (argvs; `{ns}` stands for the namespace) in a throw-away namespace: the first
    failure's message, or None when all ran."""
    namespace = f"{NAME_PREFIX}{suffix}{os.getpid():x}"
    try:
        _ip("netns", "add", namespace)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    try:
        for argv in commands:
            argv = [word.replace("{ns}", namespace) for word in argv]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            if done.returncode != 0:
                return f"{' '.join(argv)}: {done.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _ip("netns", "del", namespace, check=False)
    return None


def unavailable_reason() -> str | None:
    """Why this kernel/user cannot run the hosts (None when it can): one namespace, veth and bridge made and removed."""
    failure = _probe(
        "probe",
        ["ip", "-n", "{ns}", "link", "add", "pa", "type", "veth", "peer", "name", "pb"],
        ["ip", "-n", "{ns}", "link", "add", "pbr", "type", "bridge"],
    )
    if failure is None:
        return None
    return f"network namespaces unavailable here ({failure}); these tests need root and CONFIG_NET_NS/VETH/BRIDGE"


def netem_unavailable_reason() -> str | None:
    """Why `tc qdisc ... netem` cannot run here (None when it can)."""
    failure = _probe(
        "nprobe",
        ["ip", "-n", "{ns}", "link", "set", "lo", "up"],
        ["ip", "netns", "exec", "{ns}", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
    )
    return None if failure is None else f"no netem qdisc in this kernel (CONFIG_NET_SCH_NETEM): {failure}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Namespaces and bridges of earlier runs whose process is gone (a killed pytest never ran its finalizers)."""
    listed = _ip("netns", "list", check=False).stdout.split()
    links = [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", check=False).stdout.splitlines()]
    for name in [*listed, *links]:
        found = _STALE.match(name)
        if found and not _alive(int(found.group(1), 16)):
            if name in listed:
                _kill_namespace_processes(name)
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)


def _kill_namespace_processes(namespace: str) -> None:
    pids = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _free_subnet() -> int:
    """A third octet x with no address of 10.213.x.0/24 on this machine's root namespace."""
    used = _ip("-o", "addr", check=False).stdout
    start = os.getpid() % 200
    for offset in range(250):
        octet = 2 + (start + offset) % 250
        if f"10.213.{octet}." not in used:
            return octet
    raise NetnsError("no free 10.213.x.0/24 subnet left")


@dataclass(frozen=True)
class Host:
    """One host: its namespace, its address, and the root-side end of its link (what a partition pulls)."""

    name: str
    namespace: str
    address: str
    link: str
    inner: str = ""  # the host's own end of its link (inside its namespace)

    def argv(self, *command: str) -> list[str]:
        """`command` run inside this host (`ip netns exec` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.namespace, *command]


@dataclass
class Network:
    """A private network of hosts; `close()` removes every namespace, link and process in it."""

    tag: str = field(default_factory=lambda: f"{NAME_PREFIX}{os.getpid():x}_")
    octet: int = 0
    hosts: dict[str, Host] = field(default_factory=dict)

    def __post_init__(self) -> None:
        remove_stale()
        self.octet = _free_subnet()
        self.bridge = f"{self.tag}br"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"10.213.{self.octet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str) -> Host:
        index = len(self.hosts) + 2
        inner = f"{self.tag}i{index}"
        host = Host(name, f"{self.tag}{name}", f"10.213.{self.octet}.{index}", f"{self.tag}h{index}", inner)
        _ip("netns", "add", host.namespace)
        self.hosts[name] = host
        _ip("link", "add", host.link, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", host.namespace)
        _ip("link", "set", host.link, "master", self.bridge)
        _ip("link", "set", host.link, "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inner)
        _ip("-n", host.namespace, "link", "set", inner, "up")
        return host

    def partition(self, name: str) -> None:
        """Pull `name`'s cable: nothing reaches it, it reaches nothing (its own loopback still works)."""
        _ip("link", "set", self.hosts[name].link, "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].link, "up")

    def shape(self, name: str, *qdisc: str) -> None:
        """A root qdisc on the host's side of the link (`"netem", "delay", "20ms", "loss", "1%"`):
        traffic to the host takes it; `unshape` removes it."""
        _tc("qdisc", "replace", "dev", self.hosts[name].link, "root", *qdisc)

    def unshape(self, name: str) -> None:
        subprocess.run(["tc", "qdisc", "del", "dev", self.hosts[name].link, "root"], capture_output=True, timeout=20)

    def deafen(self, name: str) -> None:
        """An asymmetric partition: nothing reaches `name` (a zero-length queue on the way in),
        while what it sends still leaves; `unshape` heals it."""
        self.shape(name, "pfifo", "limit", "0")

    def mute(self, name: str) -> None:
        """The other asymmetric partition: what `name` sends is dropped at its own end of the
        link, while what is sent to it arrives; `unmute` heals it."""
        host = self.hosts[name]
        _tc("-n", host.namespace, "qdisc", "replace", "dev", host.inner, "root", "pfifo", "limit", "0")

    def unmute(self, name: str) -> None:
        host = self.hosts[name]
        subprocess.run(
            ["tc", "-n", host.namespace, "qdisc", "del", "dev", host.inner, "root"], capture_output=True, timeout=20
        )

    def pids(self, host: Host) -> list[int]:
        return [int(pid) for pid in _ip("netns", "pids", host.namespace, check=False).stdout.split()]

    def close(self) -> None:
        for host in self.hosts.values():
            _kill_namespace_processes(host.namespace)
        deadline = time.monotonic() + 5
        while any(_ip("netns", "pids", h.namespace, check=False).stdout.split() for h in self.hosts.values()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for host in self.hosts.values():
            _ip("netns", "del", host.namespace, check=False)  # its veth pair goes with it
            _ip("link", "del", host.link, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()


def _tc(*args: str) -> None:
    done = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise NetnsError(f"tc {' '.join(args)}: {done.stderr.strip()}")
