"""On a bus that enforces identities: the control plane starts from the State's snapshot, and only
the master may write it (`services.nats_permissions.snapshot_api`); a node's identities may not
read it (it holds every task's messages and text: `tests/security/test_read_privilege.py`)."""

from __future__ import annotations

import asyncio

import msgspec
import nats.errors
import pytest

from eventlog.log import EventLog
from eventlog.publish import LogError
from events.fold import fold
from events.synthetic import synthetic_history
from services.nats_permissions import Identity
from tests.security.conftest import SecuredBus

pytestmark = pytest.mark.timeout(60)
EVENTS = synthetic_history(200)
REFUSED_WITHIN_S = 2.0  # an unacknowledged (refused) chunk would wait for nats-py's 5 s publish timeout


async def test_the_master_writes_the_snapshot_and_the_control_plane_starts_from_it(
    bus: SecuredBus, admin_log: EventLog
) -> None:
    await admin_log.append_many(EVENTS)
    # A State the log alone cannot give (a quarantine count no event caused): only a start-up
    # that read the snapshot holds it.
    marked = msgspec.structs.replace(fold(enumerate(EVENTS, start=1)), quarantined_count=42)
    master = await EventLog.connect(bus.endpoint(Identity("master")))
    try:
        assert await master.write_snapshot(marked) == len(EVENTS)
    finally:
        await master.close()
    for identity in (Identity("api"), Identity("master")):
        log = await EventLog.connect(bus.endpoint(identity))
        try:
            assert (await log.fold(from_snapshot=True)).quarantined_count == 42, identity.name
        finally:
            await log.close()


@pytest.mark.parametrize("identity", [Identity("api"), Identity("worker", "node-a"), Identity("runner", "node-a")])
async def test_no_other_identity_may_write_the_snapshot(
    bus: SecuredBus, admin_log: EventLog, identity: Identity
) -> None:
    await admin_log.append_many(EVENTS[:10])
    log = await EventLog.connect(bus.endpoint(identity))
    try:
        with pytest.raises((nats.errors.Error, LogError, TimeoutError)):  # refused: never acknowledged
            async with asyncio.timeout(REFUSED_WITHIN_S):
                await log.write_snapshot(fold(enumerate(EVENTS[:10], start=1)))
    finally:
        await log.close()
    assert (await admin_log.fold(from_snapshot=True)).quarantined_count == 0
    assert await admin_log.message_count(stream="events") == 10
