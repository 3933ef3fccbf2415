"""One master as its own process (`python -m tests.services.master.master_process URL NAME LEASE`),
so a test can SIGKILL the leader: no clean release of the lease, as when a host dies."""

from __future__ import annotations

import asyncio
import sys

from eventlog.endpoint import NatsEndpoint
from services.master.service import Master, MasterSettings
from tests.services.master.ranks import POLICY, Catalog


def main(url: str, name: str, lease_seconds: str) -> None:
    settings = MasterSettings(
        nats=NatsEndpoint(url=url), policy=POLICY, name=name, master_lease_seconds=float(lease_seconds)
    )
    asyncio.run(Master(settings, Catalog()).run())


if __name__ == "__main__":
    main(*sys.argv[1:])
