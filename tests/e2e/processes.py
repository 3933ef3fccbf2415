"""The runner processes of a test cluster, found from /proc by their command lines."""

from __future__ import annotations

from pathlib import Path


def runner_nodes(nats_url: str) -> dict[tuple[str, int], str]:
    """(instance, rank) -> node id of the runner processes attached to `nats_url`."""
    nodes: dict[tuple[str, int], str] = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "runner.service.main" in args and nats_url in args:
            key = (args[args.index("--instance") + 1], int(args[args.index("--rank") + 1]))
            nodes[key] = args[args.index("--node-id") + 1]
    return nodes


def runner_pids(nats_url: str, node: str) -> list[int]:
    """Pids of the runner processes attached to `nats_url` on `node`."""
    pids: list[int] = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "runner.service.main" in args and nats_url in args and args[args.index("--node-id") + 1] == node:
            pids.append(int(cmdline.parent.name))
    return pids
