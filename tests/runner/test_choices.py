"""The pure decisions of a task's several completions (`runner/engine/choices.py`, and the widths in
`step_plan.next_composition`): rows and ids, seed streams, and admission in log order by width."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runner.engine.batch_plan import AgreedStep
from runner.engine.choices import admission_width, choice_rows, choice_seed, hands_prompt, row_id, task_of
from runner.engine.step_plan import Composition, next_composition
from services.api.schemas import SEED_MAX


def test_rows_of_a_task_start_with_its_own_id() -> None:
    assert choice_rows("task_ab", 3) == ("task_ab", "task_ab#1", "task_ab#2")
    assert choice_rows("task_ab", 1) == ("task_ab",)  # one completion: keyed as before
    assert {task_of(row) for row in choice_rows("task_ab", 3)} == {"task_ab"}
    assert row_id("t", 0) == "t"


@given(st.integers(0, SEED_MAX), st.integers(1, 127))
def test_each_choice_has_its_own_seed_the_runner_takes(seed: int, choice: int) -> None:
    derived = choice_seed(seed, choice)
    assert derived is not None and 0 <= derived <= SEED_MAX
    assert choice_seed(seed, 0) == seed  # choice 0 draws what n=1 draws
    assert derived != choice_seed(seed, choice + 1)
    assert derived == choice_seed(seed, choice)  # reproducible


def test_seeds_of_neighbouring_requests_do_not_collide() -> None:
    seeds = {choice_seed(s, c) for s in range(64) for c in range(8)}
    assert len(seeds) == 64 * 8  # seed s's choice 1 is not seed s+1's choice 0
    assert choice_seed(None, 3) is None  # unseeded: the process's generator


def test_a_task_wider_than_the_batch_is_admitted_as_one_row_to_fail() -> None:
    assert [admission_width(n, 4) for n in (1, 3, 4, 5, 0)] == [1, 3, 4, 1, 1]


def test_a_wide_task_joins_whole_in_log_order_and_is_not_passed() -> None:
    current = Composition(rows=("r0", "r1"), admitted=1)
    step = AgreedStep(received=4, cancelled=(False, False), tokens=(0, 0))

    def admitted(max_batch: int) -> tuple[tuple[str, ...], Composition]:
        transition = next_composition(
            current,
            step,
            stopped_rows=frozenset(),
            prefilled=frozenset(),
            join_room=0,
            pending=["wide", "n1", "n2"],
            max_batch=max_batch,
            widths={"wide": 3},
        )
        return transition.newcomers, transition.composition

    assert admitted(4)[0] == ()  # 2 rows free, it needs 3: the narrower ones wait behind it
    newcomers, composition = admitted(6)  # 4 free: its 3 rows, then one for the next
    assert newcomers == ("wide", "n1")
    assert composition.prefilling == ("wide", "wide#1", "wide#2", "n1")
    assert composition.admitted == current.admitted + 2  # assignments, not rows


def test_only_plain_or_quantized_kv_can_be_handed_to_the_other_choices() -> None:
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

    assert hands_prompt([KVCache(), QuantizedKVCache(), KVCache()]) is None
    refused = hands_prompt([KVCache(), RotatingKVCache(max_size=8)])
    assert refused is not None and "RotatingKVCache" in refused and refused.startswith("n > 1")
