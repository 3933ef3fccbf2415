"""Real hosts, real faults (issue 9 item 6): a cluster across network namespaces — three NATS
servers (R3 streams), the control host (master, API), two worker hosts whose ranks talk over veth
links — and faults injected mid-prefill and mid-decode. Each test ends with the checker
(`assert_checked`): every task completed with its full text or failed with a diagnosis, no
acknowledged event lost, no client call unbounded."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable

import pytest

from bench.cluster import long_prompt
from bench.hosts import netem_unavailable_reason
from bench.netclient import ClientCall, stream_chat, stream_in_thread
from bench.netcluster import FAST_SETTINGS, NetCluster
from events.catalogue import NodeTimedOut
from tests.netns.conftest import assert_checked

pytestmark = pytest.mark.timeout(150)

STALL = float(FAST_SETTINGS["task_stall_seconds"])
NODE_TIMEOUT = float(FAST_SETTINGS["node_timeout_seconds"])
BOUND = STALL + 30  # no client call may take longer: a hang is a failed test, not a stuck suite
PROMPT = long_prompt(150)  # ~700 tokens: ~20 prefill iterations
SHORT = "Tell me about the river"


class Inject:
    """Run a fault once, at the first SSE event where `due(call)` holds; `fired` says it did (a
    test whose fault never fired proves nothing, so each asserts it)."""

    def __init__(self, due: Callable[[ClientCall], bool], fault: Callable[[], None]) -> None:
        self.due, self.fault, self.fired = due, fault, False

    def __call__(self, call: ClientCall) -> None:
        if not self.fired and self.due(call):
            self.fired = True
            self.fault()


def mid_prefill(fault: Callable[[], None]) -> Inject:
    """At the first prefill progress event, before any text."""
    return Inject(lambda call: call.progress_seen > 0 and not call.text, fault)


def mid_decode(fault: Callable[[], None], after_chars: int = 8) -> Inject:
    """Once the stream has delivered `after_chars` characters of text."""
    return Inject(lambda call: len(call.text) >= after_chars, fault)


def request(
    cluster: NetCluster, prompt: str, max_tokens: int, hook: Callable[[ClientCall], None] | None = None
) -> ClientCall:
    with cluster.http() as http:
        return stream_chat(http, prompt, max_tokens, bound_seconds=BOUND, on_event=hook)


def served_within(cluster: NetCluster, seconds: float) -> list[ClientCall]:
    """Short requests until one completes (a fault's aftermath may fail a few, each with its
    diagnosis); every call, for the checker. Fails when none completes within `seconds`."""
    calls: list[ClientCall] = []
    deadline = time.monotonic() + seconds
    while not calls or calls[-1].outcome != "completed":
        assert time.monotonic() < deadline, f"no request served within {seconds}s: {calls}\n{cluster.tails()}"
        if calls:
            time.sleep(1.0)
        calls.append(request(cluster, SHORT, 8))
    return calls


# --- partitions ----------------------------------------------------------------------------


def test_a_partition_shorter_than_the_node_timeout_mid_decode_is_ridden_out(cluster: NetCluster) -> None:
    """The cable of rank 1's host is out for 2 s mid-decode (heartbeats resume before the node
    timeout; TCP carries the ring over the gap): the task ends either way, nothing is lost."""
    blip = mid_decode(lambda: _blip(cluster, "w1", 2.0))
    call = request(cluster, SHORT, 60, blip)
    assert blip.fired, call
    after = request(cluster, SHORT, 8)
    assert after.outcome == "completed", after
    assert_checked(cluster, [call, after])


def _blip(cluster: NetCluster, host: str, seconds: float) -> None:
    cluster.net.partition(host)
    try:
        time.sleep(seconds)
    finally:
        cluster.net.heal(host)


# --- NATS ----------------------------------------------------------------------------------


def kill_one_nats_server(cluster: NetCluster, victim: int, when: str) -> None:
    """SIGKILL NATS server `victim` mid-prefill or mid-decode of one task while another runs
    beside it; then a request is served, no service died, no node was timed out (the master's
    reading of the heartbeats stalls while it moves to a survivor: its own blindness, not the
    nodes' silence, `services/master/sight.py`), and the checker holds."""
    timed_out = cluster.count_on_log(NodeTimedOut)
    beside = stream_in_thread(cluster.http, SHORT, 40, BOUND)
    try:
        kill = (mid_prefill if when == "prefill" else mid_decode)(cluster.procs[f"nats{victim}"].process.kill)
        call = request(cluster, PROMPT if when == "prefill" else SHORT, 60, kill)
        assert kill.fired, call
        beside.join(BOUND + 5)
        after = served_within(cluster, NODE_TIMEOUT + 10)
    finally:
        cluster.start_nats(victim)  # back for the next test, which waits until it caught up (`conftest.cluster`)
    assert all(p.process.poll() is None for n, p in cluster.procs.items() if not n.startswith("nats")), cluster.tails()
    assert cluster.count_on_log(NodeTimedOut) == timed_out, "the master took its own blindness for silence"
    assert_checked(cluster, [call, beside.result, *after])


@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_killing_a_nats_server_that_does_not_lead_the_log_loses_nothing(cluster: NetCluster, when: str) -> None:
    """A follower of SHOAL_EVENTS dies: R3 keeps a quorum, every connection moves to a survivor."""
    kill_one_nats_server(cluster, (cluster.events_leader() + 1) % 3, when)


def test_killing_the_nats_server_leading_the_log_mid_decode_loses_nothing(cluster: NetCluster) -> None:
    """The leader of SHOAL_EVENTS dies mid-decode: a new leader is elected, nothing acknowledged is lost,
    and requests are served again; the master, blind while its readers move, times out no node."""
    kill_one_nats_server(cluster, cluster.events_leader(), "decode")


def test_killing_the_jetstream_meta_leader_mid_prefill_loses_nothing(cluster: NetCluster) -> None:
    """The server leading JetStream's metadata dies mid-prefill: until the survivors elect
    another (seconds), no consumer can be created, so a reader whose consumer was on that server
    is blind that long (docs/ARCHITECTURE.md §3); requests are served again afterwards."""
    kill_one_nats_server(cluster, cluster.meta_leader(), "prefill")


def test_pausing_the_whole_nats_cluster_past_the_node_timeout_is_survived(cluster: NetCluster) -> None:
    """All three servers SIGSTOPped for longer than the node timeout, mid-decode: every service
    survives, no node is timed out (the master could not see either), and requests are served
    afterwards."""
    pause = NODE_TIMEOUT + 6

    def freeze() -> None:
        cluster.signal_nats(signal.SIGSTOP)
        time.sleep(pause)
        cluster.signal_nats(signal.SIGCONT)

    timed_out = cluster.count_on_log(NodeTimedOut)
    try:
        pause_mid_decode = mid_decode(freeze)
        call = request(cluster, SHORT, 80, pause_mid_decode)
        assert pause_mid_decode.fired, call
    finally:
        cluster.signal_nats(signal.SIGCONT)
    assert all(p.process.poll() is None for p in cluster.procs.values()), cluster.tails()
    assert cluster.count_on_log(NodeTimedOut) == timed_out, "the master took its own blindness for the nodes' silence"
    cluster.wait_ready(NODE_TIMEOUT + 10)
    assert_checked(cluster, [call, *served_within(cluster, 30)])


# --- masters -------------------------------------------------------------------------------


STANDING_BY = re.compile(r"master \S+ standing by")  # its first read of the lease is done
LEASE = 5.0  # `master_lease_seconds`, the default
TAKE_OVER_BOUND = LEASE + LEASE / 4 + 3  # the lease, one stand-by read, and the new leader's first step


def wait_for_leader(cluster: NetCluster, name: str, seconds: float) -> float:
    """Seconds until master `name` holds the lease; fails after `seconds`."""
    started = time.monotonic()
    while (holder := cluster.lease_holder()) != name:
        assert time.monotonic() - started < seconds, (
            f"{name} not leading after {seconds}s ({holder!r} is)\n{cluster.tails('master')}"
        )
        time.sleep(0.25)
    return time.monotonic() - started


def fail_over(cluster: NetCluster, leader: str, standby: str, fault: Callable[[], None]) -> list[ClientCall]:
    """`fault` hits the leading master mid-decode: the stand-by leads within the lease, the task
    in flight completes, new tasks are served (assigned by the new leader, none twice)."""
    assert wait_for_leader(cluster, leader, TAKE_OVER_BOUND) >= 0
    took_over: list[float] = []

    def hit_the_leader() -> None:
        fault()
        took_over.append(wait_for_leader(cluster, standby, TAKE_OVER_BOUND))

    hit = mid_decode(hit_the_leader)
    calls = [request(cluster, SHORT, 60, hit)]
    assert hit.fired and took_over, calls
    calls += [request(cluster, SHORT, 8) for _ in range(2)]
    assert [c.outcome for c in calls] == ["completed"] * 3, calls
    assert cluster.procs[standby].process.poll() is None, cluster.procs[standby].tail()
    return calls


def test_the_leading_master_killed_or_partitioned_under_load_a_stand_by_leads_and_nothing_is_assigned_twice(
    cluster: NetCluster,
) -> None:
    """Two standalone masters, the second on a host of its own. The leader (master0, on the
    control host) is SIGKILLed mid-decode: master1 leads within the lease. master0 comes back as
    a stand-by; master1's host is then cut off mid-decode: master0 leads again within the lease,
    and master1, healed, stands by. The checker proves no task was assigned twice."""
    # The bound holds for a stand-by already reading the lease: one still starting when the leader
    # dies first sees the leader's last revision later, and waits a whole lease from then.
    cluster.start_master(1).wait_for_log_line(STANDING_BY, 60)
    try:
        calls = fail_over(cluster, "master0", "master1", cluster.procs["master0"].process.kill)
        cluster.start_master(0).wait_for_log_line(STANDING_BY, 60)
        calls += fail_over(cluster, "master1", "master0", lambda: cluster.net.partition("m1"))
    finally:
        cluster.net.heal("m1")
    time.sleep(LEASE)  # master1, back, finds master0's lease and stands by
    assert cluster.lease_holder() == "master0", cluster.tails("master")
    calls.append(request(cluster, SHORT, 8))
    assert_checked(cluster, calls)  # which checks that no task was assigned twice


# --- slow wires ----------------------------------------------------------------------------

SHAPES = {
    "netem": "netem delay 20ms loss 1%",  # latency and loss: the case, where the kernel has netem
    "tbf": "tbf rate 8mbit burst 32kbit latency 400ms",  # a narrow wire: runs on kernels without netem
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_slow_lossy_wire_on_the_ring_links_causes_no_hang(cluster: NetCluster, shape: str) -> None:
    """Both worker hosts' links shaped from before the request until after it: prefill and decode
    cross the slow wire; every call ends in its bound and the checker holds."""
    if shape == "netem" and (reason := netem_unavailable_reason()) is not None:
        pytest.skip(reason)
    workers = [worker.name for worker in cluster.workers]
    try:
        for name in workers:
            cluster.net.shape(name, *SHAPES[shape].split())
        calls = [request(cluster, PROMPT, 30), request(cluster, SHORT, 30)]
    finally:
        for name in workers:
            cluster.net.unshape(name)
    assert [c.outcome for c in calls] == ["completed", "completed"], calls
    assert_checked(cluster, calls)


# --- a worker cut off past the node timeout (last: the instance placed meanwhile spans only the
# hosts that were reachable, and the master does not move a serving instance when a node rejoins)


@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_a_partitioned_worker_fails_its_task_naming_it_and_rejoins_after_the_heal(
    shared_cluster: NetCluster, when: str
) -> None:
    """A worker host running a rank (rank 1's, while the instance spans both) is cut off past the
    node timeout: its task fails within the stall deadline with an error naming the host; after
    the heal the node is up again (no restart) and the next request is served."""
    cluster = shared_cluster.wait_ready(30, across_hosts=False)
    serving = cluster.serving_hosts()
    victim = serving[-1].name
    try:
        hook = (mid_prefill if when == "prefill" else mid_decode)(lambda: cluster.net.partition(victim))
        call = request(cluster, PROMPT if when == "prefill" else SHORT, 200, hook)
        assert hook.fired, call
        assert call.outcome == "failed", call
        assert call.seconds < STALL + 5, call  # within the stall deadline (the node timeout is shorter)
        assert victim in call.error or f"rank {len(serving) - 1}" in call.error, call.error
    finally:
        cluster.net.heal(victim)
    cluster.wait_ready(NODE_TIMEOUT + 10, across_hosts=False)  # every node up again, an instance ready
    assert_checked(cluster, [call, *served_within(cluster, 30)])
