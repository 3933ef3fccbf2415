"""Tiny random-weight models with real model families' tokens and chat templates, for tests of what
depends on the family rather than the weights: a thinking model's reasoning markers, its
`enable_thinking` switch, its tool-call format.

Each is the tiny llama (`tiny.py`) with the family's special tokens in its vocabulary and the
family's chat template as published (`templates/`): `qwen3` is Qwen3's hybrid template (the model
opens `<think>` itself; `enable_thinking=False` closes an empty block in the generation prompt),
`qwen3-thinking` the Qwen3 *-Thinking-2507 one (its generation prompt opens `<think>`), `llama3`
Llama 3.1's (tools in the first user message, a call answered as `{"name": ..., "parameters": ...}`,
results in an `ipython` turn), `mistral` Mistral 7B Instruct v0.3's (`[AVAILABLE_TOOLS]`, a call
answered as `[TOOL_CALLS] [{"name": ..., "arguments": ...}]`, 9-character call ids). The templates are
written out here from the published ones (no download).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runner.models.tiny import TinySpec, model_config, write_random_model
from runner.models.tiny_tokenizer import EOS_TOKEN, SPECIAL_TOKENS, write_tokenizer

Family = Literal["qwen3", "qwen3-thinking", "llama3", "mistral"]
TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True, slots=True)
class FamilyTokens:
    specials: tuple[str, ...]
    template: str  # a file under templates/
    eos: str = EOS_TOKEN
    bos: str | None = None
    pad: str = "<|endoftext|>"


FAMILIES: dict[Family, FamilyTokens] = {
    "qwen3": FamilyTokens(specials=(*SPECIAL_TOKENS, "<think>", "</think>"), template="qwen3.jinja"),
    "qwen3-thinking": FamilyTokens(specials=(*SPECIAL_TOKENS, "<think>", "</think>"), template="qwen3_thinking.jinja"),
    "llama3": FamilyTokens(
        specials=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        template="llama3.jinja",
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
        pad="<|end_of_text|>",
    ),
    "mistral": FamilyTokens(
        specials=(
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        template="mistral.jinja",
        eos="</s>",
        bos="<s>",
        pad="<unk>",
    ),
}


def chat_template(family: Family) -> str:
    return (TEMPLATES / FAMILIES[family].template).read_text()


def make_tiny_family(out_dir: Path, family: Family, spec: TinySpec | None = None) -> Path:
    """Write `family`'s tiny model into `out_dir` (created if needed); returns `out_dir`."""
    spec = spec or TinySpec()
    tokens = FAMILIES[family]
    out_dir.mkdir(parents=True, exist_ok=True)
    special_ids = write_tokenizer(
        out_dir,
        spec.vocab,
        specials=tokens.specials,
        chat_template=chat_template(family),
        eos_token=tokens.eos,
        bos_token=tokens.bos,
        pad_token=tokens.pad,
    )
    return write_random_model(out_dir, model_config(spec, [special_ids[tokens.eos]]), spec.seed)
