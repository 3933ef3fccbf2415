"""Tiny random-weight models with real model families' tokens and chat templates, for tests of what
depends on the family rather than the weights: a thinking model's reasoning markers, its
`enable_thinking` switch, its tool-call format.

Each is the tiny llama (`tiny.py`) with the family's special tokens in its vocabulary and the
family's chat template as published (`templates/`): `qwen3` is Qwen3's hybrid template (the model
opens `<think>` itself; `enable_thinking=False` closes an empty block in the generation prompt),
`qwen3-thinking` the Qwen3 *-Thinking-2507 one (its generation prompt opens `<think>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runner.models.tiny import TinySpec, model_config, write_random_model
from runner.models.tiny_tokenizer import EOS_TOKEN, SPECIAL_TOKENS, write_tokenizer

Family = Literal["qwen3", "qwen3-thinking"]
TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True, slots=True)
class FamilyTokens:
    specials: tuple[str, ...]
    template: str  # a file under templates/


FAMILIES: dict[Family, FamilyTokens] = {
    "qwen3": FamilyTokens(specials=(*SPECIAL_TOKENS, "<think>", "</think>"), template="qwen3.jinja"),
    "qwen3-thinking": FamilyTokens(specials=(*SPECIAL_TOKENS, "<think>", "</think>"), template="qwen3_thinking.jinja"),
}


def chat_template(family: Family) -> str:
    return (TEMPLATES / FAMILIES[family].template).read_text()


def make_tiny_family(out_dir: Path, family: Family, spec: TinySpec | None = None) -> Path:
    """Write `family`'s tiny model into `out_dir` (created if needed); returns `out_dir`."""
    spec = spec or TinySpec()
    tokens = FAMILIES[family]
    out_dir.mkdir(parents=True, exist_ok=True)
    special_ids = write_tokenizer(out_dir, spec.vocab, specials=tokens.specials, chat_template=chat_template(family))
    return write_random_model(out_dir, model_config(spec, [special_ids[EOS_TOKEN]]), spec.seed)
