"""Newcomers' proposals while they prepare, and the runner's threaded preparer (no model needed)."""

from __future__ import annotations

import threading

import pytest

from events.constraints import JsonObject
from runner.engine.batch_plan import PREPARING
from runner.engine.batch_streams import Admission
from runner.engine.prefix_cache import PrefixIndex
from runner.engine.preparation import IDLE_WAIT_SECONDS, Newcomers, Prepared, PrepareInline
from runner.engine.protocols import NeverCancelled, NullSink
from runner.engine.requests import GenerationRequest
from runner.preparer import ThreadedPreparer

pytestmark = pytest.mark.timeout(30)


def request(task_id: str, constrained: bool = False, owner: str = "") -> GenerationRequest:
    constraint = JsonObject() if constrained else None
    return GenerationRequest(
        task_id=task_id, prompt_token_ids=[1, 2, 3], max_tokens=4, constraint=constraint, cache_scope=owner
    )


def admission(task_id: str, constrained: bool = False, readable: bool = True) -> Admission:
    built = request(task_id, constrained) if readable else None
    return Admission(task_id, built, NeverCancelled(), NullSink())


class HeldPreparer:
    """A preparer whose preparations finish when the test says."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: set[str] = set()
        self.waits: list[tuple[str, float]] = []

    def start(self, request: GenerationRequest) -> None:
        if request.task_id not in self.started:
            self.started.append(request.task_id)

    def ready(self, task_id: str) -> bool:
        return task_id in self.finished

    def wait(self, task_id: str, timeout_seconds: float) -> None:
        self.waits.append((task_id, timeout_seconds))

    def take(self, task_id: str) -> Prepared:
        self.finished.remove(task_id)
        return Prepared(error=f"verdict on {task_id}")

    def discard(self, task_id: str) -> None:
        self.finished.discard(task_id)


def test_a_newcomer_is_proposed_as_preparing_until_its_preparation_is_done() -> None:
    held = HeldPreparer()
    prefixes: PrefixIndex[list[object]] = PrefixIndex(1 << 20)
    newcomers = Newcomers(prefixes, held)  # pyright: ignore[reportArgumentType]
    pending = [admission("a", constrained=True), admission("unread", readable=False), admission("b")]
    assert newcomers.propose(pending, idle=False) == [PREPARING, None, PREPARING]
    assert held.started == ["a", "b"] and held.waits == []  # started once each; a busy batch never waits
    held.finished.add("b")
    assert newcomers.propose(pending, idle=True) == [PREPARING, None, 0]
    assert held.started == ["a", "b"]
    assert held.waits == [("a", IDLE_WAIT_SECONDS)]  # an idle batch waits for the first alone
    held.finished.add("a")
    assert newcomers.propose(pending, idle=True) == [0, None, 0]
    assert newcomers.admit("a", runs=True) == (None, Prepared(error="verdict on a"))
    assert newcomers.admit("unread", runs=False) == (None, None)
    assert newcomers.admit("b", runs=False) == (None, None) and "b" not in held.finished  # discarded


def test_inline_preparation_is_ready_at_once() -> None:
    calls: list[str] = []
    inline = PrepareInline(lambda r: calls.append(r.task_id) or Prepared())
    inline.start(request("a", constrained=True))
    inline.start(request("a", constrained=True))
    assert inline.ready("a") and calls == ["a"]
    assert inline.take("a") == Prepared() and not inline.ready("a")


def test_the_threaded_preparer_compiles_grammars_off_the_calling_thread() -> None:
    threads: dict[str, str] = {}
    release = threading.Event()

    def prepare(r: GenerationRequest) -> Prepared:
        threads[r.task_id] = threading.current_thread().name
        if r.constraint is not None:
            assert release.wait(5)
        return Prepared()

    preparer = ThreadedPreparer(prepare)
    preparer.start(request("plain"))
    assert preparer.ready("plain") and threads["plain"] == threading.current_thread().name  # at once, here
    preparer.start(request("grammar", constrained=True))
    preparer.start(request("grammar", constrained=True))  # once per task
    preparer.wait("grammar", 0.05)
    assert not preparer.ready("grammar")  # still compiling: the caller went on
    release.set()
    preparer.wait("grammar", 5)
    assert preparer.ready("grammar") and threads["grammar"] != threading.current_thread().name
    assert preparer.take("grammar") == Prepared()


def test_an_unexpected_error_of_a_preparation_is_raised_where_it_is_taken() -> None:
    def prepare(r: GenerationRequest) -> Prepared:
        raise RuntimeError(f"broken {r.task_id}")

    preparer = ThreadedPreparer(prepare)
    preparer.start(request("g", constrained=True))
    preparer.wait("g", 5)
    assert preparer.ready("g")
    with pytest.raises(RuntimeError, match="broken g"):
        preparer.take("g")
    preparer.start(request("h", constrained=True))
    preparer.discard("h")
    assert not preparer.ready("h")


def test_grammars_waiting_to_compile_take_turns_by_owner() -> None:
    """Alice's burst of grammars, then Bob's: Bob's compiles as soon as the one compiling ends, not
    after all of hers; each owner's in log order; one discarded before its turn is never compiled."""
    compiled: list[str] = []
    release = threading.Semaphore(0)

    def prepare(r: GenerationRequest) -> Prepared:
        assert release.acquire(timeout=5)
        compiled.append(r.task_id)
        return Prepared()

    preparer = ThreadedPreparer(prepare)
    for n in range(1, 6):
        preparer.start(request(f"alice{n}", constrained=True, owner="alice"))
    preparer.start(request("bob1", constrained=True, owner="bob"))
    preparer.start(request("bob2", constrained=True, owner="bob"))
    preparer.discard("alice3")
    for _ in range(6):
        release.release()
    for task_id in ("alice1", "alice2", "alice4", "alice5", "bob1", "bob2"):
        preparer.wait(task_id, 5)
        assert preparer.ready(task_id), task_id
    assert compiled == ["alice1", "bob1", "alice2", "bob2", "alice4", "alice5"]
    assert not preparer.ready("alice3")


def test_a_grammar_discarded_and_started_again_is_prepared_once_more_and_the_worker_goes_on() -> None:
    compiled: list[str] = []
    release = threading.Semaphore(0)
    compiling = threading.Event()

    def prepare(r: GenerationRequest) -> Prepared:
        compiling.set()
        assert release.acquire(timeout=5)
        compiled.append(r.task_id)
        return Prepared()

    preparer = ThreadedPreparer(prepare)
    preparer.start(request("a", constrained=True))
    assert compiling.wait(5)  # a compiles: it holds the worker
    preparer.start(request("b", constrained=True))
    preparer.discard("a")
    preparer.start(request("a", constrained=True))  # after b, in a future of its own
    for _ in range(3):
        release.release()
    for task_id in ("b", "a"):
        preparer.wait(task_id, 5)
        assert preparer.ready(task_id), task_id
    assert compiled == ["a", "b", "a"] and preparer.take("a") == Prepared()
    preparer.start(request("c", constrained=True))  # the worker still serves
    release.release()
    preparer.wait("c", 5)
    assert preparer.ready("c")
