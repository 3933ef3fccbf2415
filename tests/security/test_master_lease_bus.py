"""The masters' lease on the secured bus: the admin creates the bucket with the streams; the master
identity may read and compare-and-swap its one key, and nothing else of the bucket; no other
identity may touch it (a worker that could write the lease could silence the leader)."""

from __future__ import annotations

import pytest

from eventlog.log import EventLog
from eventlog.streams import LEASE_BUCKET, MASTER_LEASE_KEY
from services.master.lease import KvLease
from services.nats_permissions import Identity
from tests.security.conftest import SecuredBus
from tests.security.test_bus_permissions import SERVICES, refusal

LEASE_KEY_SUBJECT = f"$KV.{LEASE_BUCKET}.{MASTER_LEASE_KEY}"


async def test_the_master_identity_takes_renews_and_releases_the_lease(bus: SecuredBus, admin_log: EventLog) -> None:
    async with KvLease.open(bus.endpoint(Identity("master")), "master-a", lease_seconds=2.0) as lease:
        await lease.step()  # reads the vacant key, creates it
        assert lease.leading()
        first = lease.state.revision
        await lease.step()  # renews
        assert lease.leading() and lease.state.revision != first
        async with KvLease.open(bus.endpoint(Identity("master")), "master-b", lease_seconds=2.0) as stand_by:
            await stand_by.step()
            assert not stand_by.leading()
        await lease.release()
        await stand_by_takes_vacant_lease(bus)


async def stand_by_takes_vacant_lease(bus: SecuredBus) -> None:
    async with KvLease.open(bus.endpoint(Identity("master")), "master-c", lease_seconds=2.0) as lease:
        await lease.step()
        assert lease.leading(), "a released lease is taken at the next read"


async def test_the_master_may_not_manage_the_bucket_nor_write_other_keys(bus: SecuredBus, admin_log: EventLog) -> None:
    for subject in (
        f"$KV.{LEASE_BUCKET}.other",
        f"$JS.API.STREAM.CREATE.KV_{LEASE_BUCKET}",
        f"$JS.API.STREAM.DELETE.KV_{LEASE_BUCKET}",
        f"$JS.API.STREAM.PURGE.KV_{LEASE_BUCKET}",
    ):
        said = await refusal(bus, Identity("master"), publish=subject)
        assert f'Permissions Violation for Publish to "{subject}"' in said


@pytest.mark.parametrize("identity", [i for i in SERVICES if i.role != "master"], ids=lambda i: i.name)
async def test_no_other_service_touches_the_lease(bus: SecuredBus, admin_log: EventLog, identity: Identity) -> None:
    for subject in (LEASE_KEY_SUBJECT, f"$JS.API.DIRECT.GET.KV_{LEASE_BUCKET}.{LEASE_KEY_SUBJECT}"):
        said = await refusal(bus, identity, publish=subject)
        assert f'Permissions Violation for Publish to "{subject}"' in said
