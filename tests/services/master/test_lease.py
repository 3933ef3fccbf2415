"""The master lease state machine on an injected clock: who may claim, when, against which revision."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.master.lease import LEADER_SHARE, NS, LeaseRecord, LeaseState

LEASE = 4.0


def record(holder: str = "other", lease_seconds: float = LEASE) -> LeaseRecord:
    return LeaseRecord(holder=holder, lease_seconds=lease_seconds)


def test_nothing_is_claimed_before_the_key_was_read() -> None:
    assert LeaseState("a", LEASE).claim(0) is None


def test_a_vacant_key_is_created_at_once_and_leads_for_a_share_of_the_lease() -> None:
    lease = LeaseState("a", LEASE)
    lease.observe_vacant(10)
    assert lease.claim(10) == 0
    lease.won(revision=7, sent_ns=10)
    assert lease.leading(10 + int(LEASE * LEADER_SHARE * NS) - 1)
    assert not lease.leading(10 + int(LEASE * LEADER_SHARE * NS))
    assert lease.claim(11) == 7  # the leader renews against its own revision


def test_a_stand_by_claims_only_a_revision_unchanged_for_a_whole_lease() -> None:
    lease = LeaseState("b", LEASE)
    lease.observe(3, record(), 0)
    lease.observe(3, record(), int(3.9 * NS))
    assert lease.claim(int(3.9 * NS)) is None
    lease.observe(4, record(), int(3.95 * NS))  # the leader renewed: the wait starts again
    assert lease.claim(int(7.9 * NS)) is None
    assert lease.claim(int(7.95 * NS)) == 4


def test_the_wait_is_the_holders_lease_not_the_stand_bys() -> None:
    lease = LeaseState("b", 1.0)
    lease.observe(3, record(lease_seconds=10.0), 0)
    assert lease.claim(int(9 * NS)) is None
    assert lease.claim(int(10 * NS)) == 3
    lease.observe(4, None, int(10 * NS))  # an unreadable value: wait our own lease
    assert lease.claim(int(11 * NS)) == 4


def test_a_failed_swap_stands_by_until_the_key_is_read_again() -> None:
    lease = LeaseState("a", LEASE)
    lease.observe_vacant(0)
    lease.won(1, 0)
    lease.lost()
    assert not lease.leading(1) and lease.claim(1) is None
    lease.observe(2, record(), 2)
    assert lease.claim(2) is None


def test_a_lapsed_lease_still_ours_is_claimed_back_at_once() -> None:
    lease = LeaseState("a", LEASE)
    lease.observe_vacant(0)
    lease.won(5, 0)
    later = int(100 * NS)  # NATS was away: the lease lapsed, nobody wrote meanwhile
    assert not lease.leading(later)
    lease.observe(5, record("a"), later)
    assert lease.claim(later) == 5


def test_a_released_lease_leads_no_more() -> None:
    lease = LeaseState("a", LEASE)
    lease.observe_vacant(0)
    lease.won(5, 0)
    lease.released()
    assert not lease.leading(1)


@given(
    lease_seconds=st.floats(0.5, 30),
    write_delay=st.integers(0, 5 * NS),
    seen_delay=st.integers(0, 5 * NS),
    stand_by_lease=st.floats(0.5, 30),
)
def test_the_leader_stops_before_any_stand_by_may_take_over(
    lease_seconds: float, write_delay: int, seen_delay: int, stand_by_lease: float
) -> None:
    """However late the write lands and the stand-by reads it, on clocks of the same rate."""
    sent = 1_000 * NS
    leader = LeaseState("a", lease_seconds)
    leader.observe_vacant(sent)
    leader.won(9, sent)
    stand_by = LeaseState("b", stand_by_lease)
    seen = sent + write_delay + seen_delay
    stand_by.observe(9, leader.record, seen)
    earliest = seen + int(lease_seconds * NS)
    assert stand_by.claim(earliest - 1) is None and stand_by.claim(earliest) == 9
    assert not leader.leading(earliest - int(lease_seconds * (1 - LEADER_SHARE) * NS))
