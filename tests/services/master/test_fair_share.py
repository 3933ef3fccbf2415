"""The master's fair share between API keys (`services/master/fair_share.py`): what an instance is
handed, and in which order; pure, then through the core as the log would feed it."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import msgspec
from hypothesis import given, settings

from events.apply import apply
from events.catalogue import (
    InstancePlaced,
    LogEvent,
    PrefillStarted,
    TaskAssigned,
    TaskCompleted,
    TaskFailed,
    TaskParams,
)
from events.ids import InstanceId, KeyId, TaskId
from events.runner_settings import RunnerSettings
from events.state import InstanceInfo, TaskInfo
from services.master.core import MasterCore, MasterPolicy
from services.master.fair_share import fair_assignments, handed_ahead, held_limit, room_of, started
from services.master.watchdog import Liveness, tick
from services.ops.advice import unassigned_reasons
from tests.events.builders import fake_stamper
from tests.services.master.test_core import Catalog, Cluster


def task(task_id: str, owner: str, seq: int) -> TaskInfo:
    return TaskInfo(
        task_id=TaskId(task_id), model="tiny", messages=[], params=TaskParams(), owner=KeyId(owner), created_seq=seq
    )


def instance(instance_id: str, max_batch: int, queue: tuple[str, ...] = (), placed_seq: int = 0) -> InstanceInfo:
    return InstanceInfo(
        instance_id=InstanceId(instance_id),
        model="tiny",
        shards=(),
        ring_hosts=(),
        settings=RunnerSettings(max_batch=max_batch),
        runners=(),
        placed_seq=placed_seq,
        placed_at=0,
        queue=tuple(TaskId(t) for t in queue),
    )


def holding(*specs: tuple[str, str, bool]) -> dict[TaskId, TaskInfo]:
    """Tasks an instance holds: (id, owner, started)."""
    return {
        TaskId(t): msgspec.structs.replace(task(t, owner, 0), status="prefilling" if begun else "assigned")
        for t, owner, begun in specs
    }


def test_one_key_is_handed_in_log_order_a_few_ahead_of_what_runs() -> None:
    waiting = [task(f"t{n}", "", n) for n in range(20)]
    assert held_limit(instance("i1", 8)) == 8 + handed_ahead(8) == 10
    assert [t for t, _ in fair_assignments(waiting, [instance("i1", 8)], {})] == ["t0", "t1"]  # nothing runs yet
    running = holding(*((f"r{n}", "", True) for n in range(8)))
    handed = fair_assignments(waiting, [instance("i1", 8, tuple(running))], running)
    assert [t for t, _ in handed] == ["t0", "t1"]  # a full batch and 2 ahead


def test_a_batch_its_kv_bounds_below_max_batch_is_handed_no_more_than_the_few_ahead() -> None:
    """3 streams run (the KV holds no more) and 2 wait at the runner: nothing more is handed, so a
    later key's task is not queued behind a flood at the runner."""
    held = holding(*((f"r{n}", "alice", True) for n in range(3)), ("p0", "alice", False), ("p1", "alice", False))
    assert fair_assignments([task("b0", "bob", 9)], [instance("i1", 8, tuple(held))], held) == []
    held = holding(*((f"r{n}", "alice", True) for n in range(4)), ("p1", "alice", False))  # p0 joined
    assert fair_assignments([task("b0", "bob", 9)], [instance("i1", 8, tuple(held))], held) == [("b0", "i1")]


def test_a_key_holding_less_goes_first_whatever_the_log_order() -> None:
    """alice's flood holds 9 of the 10 places; bob's one request, sent after alice's other 20, takes
    the place that is left."""
    held = holding(*((f"a{n}", "alice", n < 8) for n in range(9)))
    waiting = [*(task(f"a{n}", "alice", n) for n in range(9, 29)), task("b0", "bob", 30)]
    assert fair_assignments(waiting, [instance("i1", 8, tuple(held))], held) == [("b0", "i1")]


def wide(task_id: str, owner: str, seq: int, n: int) -> TaskInfo:
    return msgspec.structs.replace(task(task_id, owner, seq), params=TaskParams(n=n))


def test_a_task_of_n_completions_counts_n_rows_in_the_places_and_in_its_keys_turn() -> None:
    """A batch of 8 holds 8 rows and 2 ahead: alice's task of 4 choices runs (4 rows), bob's one
    request is handed before her next, and her next of 4 is handed while a row is free, then nothing."""
    held = {TaskId("a0"): msgspec.structs.replace(wide("a0", "alice", 0, 4), status="decoding")}
    waiting = [wide("a1", "alice", 1, 4), task("b0", "bob", 2), wide("a2", "alice", 3, 4)]
    one = instance("i1", 8, ("a0",))
    assert room_of(one, held) == 2  # two ahead, the batch's 8 rows less a0's 4 leave more
    assert fair_assignments(waiting, [one], held) == [("b0", "i1"), ("a1", "i1")]  # bob holds fewer rows
    full = holding(*((f"r{n}", "carol", True) for n in range(7)))
    assert room_of(instance("i1", 8, tuple(full)), full) == 2
    handed = fair_assignments([wide("a1", "alice", 1, 4), task("b0", "bob", 2)], [instance("i1", 8, tuple(full))], full)
    assert handed == [("a1", "i1")]  # a row free: handed whole (it joins when 4 free), then nothing more


def test_keys_take_turns_oldest_first_between_equals() -> None:
    waiting = [*(task(f"a{n}", "alice", n) for n in range(6)), *(task(f"b{n}", "bob", 10 + n) for n in range(2))]
    handed = [t for t, _ in fair_assignments(waiting, [instance("i1", 24)], {})]
    assert handed == ["a0", "b0", "a1", "b1", "a2", "a3"]  # handed_ahead(24) == 6


def test_tasks_go_to_the_instance_holding_fewest_while_one_has_room() -> None:
    held = holding(*((t, "", True) for t in ("x", "y", "z", "w", "v")))
    full = instance("full", 2, ("x", "y", "z", "w"), placed_seq=1)
    light = instance("light", 2, ("v",), placed_seq=2)
    handed = fair_assignments([task(f"t{n}", "", n) for n in range(5)], [full, light], held)
    assert handed == [("t0", "light"), ("t1", "light")]


owners_st = st.sampled_from(["", "alice", "bob", "carol"])


@settings(max_examples=300, deadline=None)
@given(
    waiting_owners=st.lists(owners_st, max_size=40),
    instances_spec=st.lists(
        st.tuples(st.integers(1, 12), st.lists(st.tuples(owners_st, st.booleans()), max_size=16)),
        min_size=1,
        max_size=3,
    ),
)
def test_every_handing_is_bounded_complete_and_fair(
    waiting_owners: list[str], instances_spec: list[tuple[int, list[tuple[str, bool]]]]
) -> None:
    """Never past an instance's limits (in all, and not yet started); as many as there is room
    for; each key's own tasks in log order; and each task goes to a key holding no more than any
    other key that still waits."""
    held: dict[TaskId, TaskInfo] = {}
    instances: list[InstanceInfo] = []
    for index, (max_batch, spec) in enumerate(instances_spec):
        kept = spec[: max_batch + handed_ahead(max_batch)]
        tasks = holding(*((f"h{index}-{n}", owner, begun) for n, (owner, begun) in enumerate(kept)))
        held.update(tasks)
        instances.append(instance(f"i{index}", max_batch, tuple(tasks), placed_seq=index))
    waiting = [task(f"w{n}", owner, n) for n, owner in enumerate(waiting_owners)]
    handed = fair_assignments(waiting, instances, held)

    assert len(handed) == min(sum(room_of(i, held) for i in instances), len(waiting))
    per_instance = Counter(target for _, target in handed)
    for i in instances:
        not_started = sum(1 for t in i.queue if not started(held[t]))
        assert len(i.queue) + per_instance[i.instance_id] <= held_limit(i)
        assert not_started + per_instance[i.instance_id] <= max(not_started, handed_ahead(i.settings.batch_rows))
    owner_of = {t.task_id: t.owner for t in waiting}
    load = Counter(t.owner for t in held.values())
    remaining = Counter(owner_of.values())
    for task_id, _ in handed:
        owner = owner_of[task_id]
        still_waiting = [o for o, n in remaining.items() if n > 0]
        assert load[owner] == min(load[o] for o in still_waiting)
        load[owner] += 1
        remaining[owner] -= 1
    for owner in set(owner_of.values()):
        mine = [t for t, _ in handed if owner_of[t] == owner]
        assert mine == [t.task_id for t in waiting if t.owner == owner][: len(mine)]


def test_a_flood_holds_the_instance_and_another_keys_request_takes_the_next_place() -> None:
    """Through the core, the runner played by hand: alice's 30 requests are handed 2 ahead of what
    runs, up to the batch of 4 and 2 ahead; bob's request, sent after all of hers, waits at the
    master, and takes the first place that frees: when one of alice's ends and the one handed ahead
    joins the batch in its place. Alice's next one comes after it."""
    c = Cluster(MasterPolicy(runner_settings=RunnerSettings(max_batch=4)))
    instance_id = InstanceId(c.ready_instance())

    def assigned(*events: LogEvent) -> list[str]:
        return [e.task_id for e in c.feed(*events) if isinstance(e, TaskAssigned)]

    def start(task_id: str) -> PrefillStarted:
        return c.ev.started(task_id, rank=0)

    def end(task_id: str) -> TaskCompleted:
        return TaskCompleted(env=c.ev.task_rank(task_id).stamp(), task_id=TaskId(task_id), finish_reason="stop")

    assert assigned(*(c.ev.created(f"a{n}", owner="alice") for n in range(30))) == ["a0"]  # warm-up + a0: 2 ahead
    assert assigned(start("warm"), start("a0")) == ["a1", "a2"]
    assert assigned(start("a1"), start("a2")) == ["a3", "a4"]
    assert len(c.state.instances[instance_id].queue) == 4 + handed_ahead(4)  # a batch of 4 and 2 ahead
    assert assigned(c.ev.created("b0", owner="bob")) == []  # full: bob waits at the master
    assert assigned(end("a0")) == []  # a3 and a4 are still ahead
    assert assigned(start("a3")) == ["b0"]  # a3 joined the batch in a0's place
    assert assigned(end("a1"), start("a4")) == ["a5"]


def test_a_task_waiting_for_a_place_is_not_failed_as_unassigned() -> None:
    """The assign timeout is for a model with no ready instance; one waiting its turn on a ready,
    full instance waits (only the request deadline ends it)."""
    policy = MasterPolicy(
        runner_settings=RunnerSettings(max_batch=1), assign_timeout_seconds=5, request_timeout_seconds=0
    )
    c = Cluster(policy)
    c.ready_instance()
    c.feed(*(c.ev.created(f"t{n}") for n in range(6)))
    c.clock.advance(60)
    held = {t.task_id for t in c.state.tasks.values() if t.instance_id is None}
    assert len(held) == 6 - (handed_ahead(1) - 1)  # the warm-up task holds one of the places ahead
    out = tick(c.state, c.clock.now_ns, Liveness(), policy, fake_stamper("master", c.clock))
    assert not [e for e in out if isinstance(e, TaskFailed) and e.task_id in held]  # the running ones may stall
    policy = MasterPolicy(assign_timeout_seconds=5)  # with no instance ready (this one loads), it holds
    lone = Cluster(policy)
    lone.feed(lone.ev.node("n1"), lone.ev.created("t0"))
    lone.clock.advance(60)
    out = tick(lone.state, lone.clock.now_ns, Liveness(), policy, fake_stamper("master", lone.clock))
    assert [type(e).__name__ for e in out] == ["TaskFailed"]


def test_an_instance_that_does_not_batch_is_handed_one_task_and_a_few_ahead() -> None:
    assert held_limit(instance("one", 1)) == 1 + handed_ahead(1) == 3


def test_an_instance_with_a_quantized_kv_cache_batches_like_any_other() -> None:
    quantized = InstanceInfo(
        instance_id=InstanceId("q"),
        model="tiny",
        shards=(),
        ring_hosts=(),
        runners=(),
        placed_seq=0,
        placed_at=0,
        settings=RunnerSettings(max_batch=32, kv_bits=8),
    )
    assert held_limit(quantized) == held_limit(instance("plain", 32)) == 32 + handed_ahead(32)


def test_diagnose_says_a_task_waits_for_a_place_on_a_full_instance() -> None:
    c = Cluster(MasterPolicy(runner_settings=RunnerSettings(max_batch=1)))
    instance_id = c.ready_instance()
    c.feed(*(c.ev.created(f"t{n}") for n in range(5)))
    reasons = unassigned_reasons(c.state, "tiny")
    assert reasons[0].startswith(
        f"instance {instance_id} was ready and full: it held 2 tasks (2 rows: a task of n completions is n), "
        "2 rows of them not started (a batch of 1"
    ), reasons


def test_tasks_waiting_for_a_place_outlive_an_instance_that_fails() -> None:
    """Only what the instance held fails with it; the tasks still at the master go to its replacement."""
    c = Cluster(MasterPolicy(runner_settings=RunnerSettings(max_batch=1)))
    instance_id = c.ready_instance()
    c.feed(*(c.ev.created(f"t{n}") for n in range(6)))
    held = set(c.state.instances[InstanceId(instance_id)].queue)
    out = c.feed(c.ev.runner(1, "failed", instance_id))
    assert {e.task_id for e in out if isinstance(e, TaskFailed)} == held
    (replacement,) = [e for e in out if isinstance(e, InstancePlaced)]
    assigned = c.feed(*(c.ev.runner(r, "ready", replacement.instance_id) for r in range(len(replacement.shards))))
    handed = [e.task_id for e in assigned if isinstance(e, TaskAssigned)]
    assert handed == sorted(f"t{n}" for n in range(6) if f"t{n}" not in held)[: handed_ahead(1)]
    assert all(c.state.tasks[TaskId(t)].status == "assigned" for t in handed)


def test_a_master_that_takes_over_hands_the_places_its_predecessor_never_filled() -> None:
    """A task ends while no master decides (the leader died first): the next master's `reconcile`
    hands the freed place, so no task waits at the master for an event that already passed."""
    c = Cluster(MasterPolicy(runner_settings=RunnerSettings(max_batch=1)))
    instance_id = c.ready_instance()
    c.feed(*(c.ev.created(f"t{n}") for n in range(6)))
    head = c.state.instances[InstanceId(instance_id)].queue[0]
    ended = TaskCompleted(env=c.ev.task_rank(head).stamp(), task_id=head, finish_reason="stop")
    c.state = apply(c.state, c.state.last_seq + 1, ended)  # folded, never decided on
    successor = MasterCore(c.policy, Catalog(), fake_stamper("master-2", c.clock))
    handed = [e.task_id for e in successor.reconcile(c.state) if isinstance(e, TaskAssigned)]
    assert len(handed) == 1 and c.state.tasks[TaskId(handed[0])].instance_id is None
