"""`shoal worker` whose clock runs `--skew-seconds` off (`python -m tests.e2e.skewed_worker`).

Only the worker's Stamper gets the skewed clock (injected, as `Worker` allows): its heartbeats and
announcements carry wall times an hour (say) off the master's, as on a host with a wrong clock.
Its runners keep the real clock; nothing in the process is patched.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from services.config import resolve_config
from services.roles import worker_settings
from services.worker.service import Worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--skew-seconds", type=float, required=True)
    args = parser.parse_args()
    skew_ns = int(args.skew_seconds * 1e9)
    settings = worker_settings(resolve_config().config, args.node_id)
    worker = Worker(settings, wall_ns=lambda: time.time_ns() + skew_ns)
    try:
        asyncio.run(worker.run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
