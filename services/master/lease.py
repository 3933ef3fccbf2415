"""Which master leads: a lease on one key of a JetStream KV bucket (`eventlog.streams.LEASE_BUCKET`).

Several masters may run; each folds the log, but only the holder of the lease decides. The lease is
a KV key whose value names the holder and its lease length; every write to it is a
compare-and-swap on the key's revision (`create` when vacant, `update(last=revision)` otherwise),
so of two masters claiming the same revision exactly one wins.

No wall clock is compared across hosts. Each master measures with its own monotonic clock:
- the leader, holding revision r, renews (CAS r -> r') every `lease / 4`; it counts itself leader
  until `sent + lease * LEADER_SHARE`, `sent` being when it *sent* the write that gave it r';
- a stand-by reads the key every `lease / 4` and notes when it first saw each revision; a revision
  unchanged for the holder's whole `lease` (its own clock) may be claimed (CAS on that revision).
The write that made r' happened after the leader's `sent` and before the stand-by first saw r', so
the leader's deadline falls at least `lease * (1 - LEADER_SHARE)` before the earliest take-over
(clock rates may differ by far less than that over a few seconds). A leader that cannot renew in
time (dead, paused, partitioned) therefore stops deciding before anyone else starts; decisions
already in flight are stored once by JetStream's de-duplication (their ids derive from their cause,
`services/master/core.py`).

A leader that stops cleanly deletes the key (CAS on its revision), so a stand-by takes over at its
next read instead of a lease later. A master whose own lease lapsed (NATS unreachable) and finds
its own revision still there claims it back at once: the CAS proves no one took it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

import msgspec
import nats.errors
import nats.js.errors
from loguru import logger
from nats.js.kv import KeyValue

from eventlog.client import NatsClient
from eventlog.endpoint import NatsEndpoint
from eventlog.publish import LogError
from eventlog.streams import LEASE_BUCKET, MASTER_LEASE_KEY

NS = 1_000_000_000
DEFAULT_LEASE_SECONDS = 5.0  # `master_lease_seconds`: a dead leader is replaced within about this long
LEADER_SHARE = 0.75  # the leader counts its lease this much of the stand-bys' wait
POLLS_PER_LEASE = 4  # renewals (leader) and reads (stand-by) per lease


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The value under the lease key: who holds it, and how long a stand-by waits on one revision."""

    holder: str
    lease_seconds: float


class LeaseState:
    """The pure lease state machine of one master, on its own monotonic clock (ns, passed in).

    The shell reports what it read (`observe`, `observe_vacant`) and what its writes did (`won`,
    `lost`); `claim` says whether to write now, and against which revision.
    """

    def __init__(self, holder: str, lease_seconds: float) -> None:
        self.holder = holder
        self.lease_ns = int(lease_seconds * NS)
        self.record = LeaseRecord(holder=holder, lease_seconds=lease_seconds)
        self.revision: int | None = None  # the newest revision known; 0 = the key is vacant
        self.seen_since_ns = 0  # when this master first saw `revision` (stand-by)
        self.wait_ns = self.lease_ns  # the holder's lease: how long `revision` must stay unchanged
        self.written: int | None = None  # the revision this master wrote last
        self.held_until_ns = 0  # the leader's deadline; 0 when not leading

    def leading(self, now_ns: int) -> bool:
        return now_ns < self.held_until_ns

    def observe(self, revision: int, record: LeaseRecord | None, now_ns: int) -> None:
        """The key holds `revision` (its value `record`, None when unreadable)."""
        if revision != self.revision:
            self.revision, self.seen_since_ns = revision, now_ns
        self.wait_ns = int(record.lease_seconds * NS) if record is not None else self.lease_ns

    def observe_vacant(self, now_ns: int) -> None:
        """No key, or a deleted one: the lease is free now."""
        self.observe(0, None, now_ns)

    def claim(self, now_ns: int) -> int | None:
        """The revision to compare-and-swap against now (0: create), or None: wait."""
        if self.leading(now_ns):
            return self.revision  # a renewal
        if self.revision is None:
            return None  # nothing read yet
        if self.revision == 0 or self.revision == self.written:
            return self.revision  # vacant, or still our own lapsed lease
        return self.revision if now_ns - self.seen_since_ns >= self.wait_ns else None

    def won(self, revision: int, sent_ns: int) -> None:
        """Our write (sent at `sent_ns`) stored `revision`: we lead until the deadline it buys."""
        self.revision = self.written = revision
        self.seen_since_ns = sent_ns
        self.held_until_ns = sent_ns + int(self.lease_ns * LEADER_SHARE)

    def lost(self) -> None:
        """Our compare-and-swap failed: someone else wrote. Stand by and read again."""
        self.revision = None
        self.held_until_ns = 0

    def released(self) -> None:
        self.revision = self.written = None
        self.held_until_ns = 0


class Leadership(Protocol):
    """What the master asks of a lease: whether it leads now, and a loop that keeps it."""

    def leading(self) -> bool: ...

    async def keep(self, transitions: asyncio.Queue[bool]) -> None:
        """Run until cancelled; put whether it leads once it knows, then True on becoming leader and
        False on ceasing to be."""
        ...


class KvLease:
    """The lease shell: one nats-py connection, the KV bucket, the loop that reads and writes."""

    def __init__(self, kv: KeyValue, state: LeaseState, mono_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.kv = kv
        self.state = state
        self.mono_ns = mono_ns
        self.poll_seconds = state.lease_ns / NS / POLLS_PER_LEASE

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        endpoint: NatsEndpoint,
        holder: str,
        lease_seconds: float,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> AsyncGenerator[KvLease]:
        client = await NatsClient.open(endpoint, name=f"shoal-{holder}-lease", wait_seconds=5.0)
        try:
            js = client.nc.jetstream(timeout=max(lease_seconds / POLLS_PER_LEASE, 0.5))  # pyright: ignore[reportUnknownMemberType]
            try:
                await js.key_value(LEASE_BUCKET)  # only to say so when the bucket is missing
            except nats.js.errors.BucketNotFoundError as exc:
                raise LogError(
                    f"the master lease bucket {LEASE_BUCKET} does not exist: it is created with the streams "
                    "by the admin identity (`shoal up` does it; or run any service once as admin)"
                ) from exc
            # Read from the bucket's stream leader, never directly from any replica: a replica still
            # catching up (a NATS server just restarted) answers an old revision, and a stand-by
            # whose reads alternate between two revisions never sees one last a whole lease.
            kv = KeyValue(
                name=LEASE_BUCKET, stream=f"KV_{LEASE_BUCKET}", pre=f"$KV.{LEASE_BUCKET}.", js=js, direct=False
            )
            lease = cls(kv, LeaseState(holder, lease_seconds), mono_ns)
            try:
                yield lease
            finally:
                await lease.release()
        finally:
            client.closing.set()
            await client.nc.close()

    def leading(self) -> bool:
        return self.state.leading(self.mono_ns())

    async def keep(self, transitions: asyncio.Queue[bool]) -> None:
        """Step every `poll_seconds`, telling each change of leadership. A lease that lapsed is told
        as lost even when the next step claims it back: while it lapsed the master dropped its
        decisions, and a master that takes over reconciles. It may lapse between steps (the loop
        slowed past the leader's share of it), or during one: a renewal answered after the
        deadline it extends renews the lease, but the master led no more meanwhile."""
        told: bool | None = None  # the first step's outcome is news either way
        while True:
            deadline = self.state.held_until_ns
            await self.step()
            if told and self.mono_ns() >= deadline:  # lapsed before or during the step, renewed by it or not
                told = False
                transitions.put_nowait(told)
            leading = self.leading()
            if leading != told:
                told = leading
                transitions.put_nowait(told)
            await asyncio.sleep(self.poll_seconds)

    async def step(self) -> None:
        """One read (when standing by) and, when due, one compare-and-swap."""
        try:
            if not self.leading():
                await self._read()
            expected = self.state.claim(self.mono_ns())
            if expected is not None:
                await self._write(expected)
        except (TimeoutError, nats.errors.Error) as exc:  # NATS away: the clock ends the lease if need be
            logger.warning("master lease ({}): {!r}", self.state.holder, exc)

    async def _read(self) -> None:
        try:
            entry = await self.kv.get(MASTER_LEASE_KEY)
        except nats.js.errors.KeyNotFoundError:
            self.state.observe_vacant(self.mono_ns())
            return
        try:
            record = msgspec.json.decode(entry.value or b"", type=LeaseRecord)
        except msgspec.DecodeError:
            record = None  # not ours to judge: wait our own lease on it like on any other
        self.state.observe(entry.revision or 0, record, self.mono_ns())

    async def _write(self, expected: int) -> None:
        value = msgspec.json.encode(self.state.record)
        sent = self.mono_ns()
        try:
            if expected == 0:
                revision = await self.kv.create(MASTER_LEASE_KEY, value)
            else:
                revision = await self.kv.update(MASTER_LEASE_KEY, value, last=expected)
        except nats.js.errors.KeyWrongLastSequenceError:
            self.state.lost()
            return
        self.state.won(revision, sent)

    async def release(self) -> None:
        """Hand the lease back (delete the key if it is still ours), so a stand-by need not wait."""
        written = self.state.written
        if written is None or not self.leading():
            return
        self.state.released()
        with contextlib.suppress(TimeoutError, nats.errors.Error):
            await self.kv.delete(MASTER_LEASE_KEY, last=written)
