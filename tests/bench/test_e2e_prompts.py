"""`shoal bench e2e`'s cold prompts: one per side and round, never seen before, all of one token
count on the tiny tokenizer, so every side's cold prefill is the same work."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bench.e2e import COLD_ALPHABET, COLD_DIGITS, PROMPT, cold_prompt
from runner.models.tiny_tokenizer import write_tokenizer

SIDES = 10  # a run's sides: `bench.e2e.SIDES` and the two more on 1 worker (json_schema, adjusted)


def test_every_side_and_round_gets_a_prompt_of_its_own() -> None:
    prompts = [cold_prompt(r, s, SIDES) for r in range(200) for s in range(SIDES)]
    assert len(set(prompts)) == len(prompts)
    assert all(p.endswith(PROMPT) and set(p[:COLD_DIGITS]) <= set(COLD_ALPHABET) for p in prompts)
    with pytest.raises(ValueError, match="more rounds"):
        cold_prompt(len(COLD_ALPHABET) ** COLD_DIGITS, 0, SIDES)


def test_cold_prompts_are_all_one_token_count_on_the_tiny_tokenizer(tmp_path: Path) -> None:
    write_tokenizer(tmp_path, 1024)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    counts = {len(tokenizer.encode(cold_prompt(r, s, SIDES)).ids) for r in range(0, 5000, 7) for s in range(SIDES)}
    assert len(counts) == 1  # each letter one token: the prefix never merges with its neighbours
    assert counts.pop() >= len(tokenizer.encode(PROMPT).ids) + COLD_DIGITS
