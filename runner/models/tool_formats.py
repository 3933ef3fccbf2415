"""Which tool-call format a model writes, read from its chat template (pure: no MLX).

The choice follows mlx-lm's (`mlx_lm.tokenizer_utils._infer_tool_parser`, which cannot be imported
where MLX is not loaded): the same template markers, in the same order, name one of mlx-lm's
parsers (`mlx_lm/tool_parsers/<name>.py`). Llama 3.1/3.2 templates, which mlx-lm has no parser
for, are recognised by their `ipython` tool-result turn and their `"parameters"` call shape and
get shoal's own `llama3_json` parser (`services/api/tool_parsers.py`).

The API reads a model's calls with the parser its template names, and a forced call
(`tool_choice` "required" or named) is written by the sampling rank's grammar in the same format
(`runner/models/grammar.py`); `ToolCallRequired.format` carries the API's choice so the runner can
check it made the same one. Formats without a grammar are parsed but cannot be forced: the API
refuses such a `tool_choice` with a 400.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from events.constraints import ForcedCallFormat


@dataclass(frozen=True, slots=True)
class ToolFormat:
    parser: str  # mlx_lm.tool_parsers.<parser>, or shoal's `llama3_json`
    forced: ForcedCallFormat | None  # the grammar a forced call is written in; None: no grammar for it


JSON_TOOLS = ToolFormat(parser="json_tools", forced="json_tools")
LLAMA3_JSON = ToolFormat(parser="llama3_json", forced="llama3_json")
# mlx-lm's template markers -> parser, in the order it tries them (first match wins)
_MLX_LM_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<minimax:tool_call>",), "minimax_m2"),
    (("<|tool_call>", "<tool_call|>"), "gemma4"),
    (("<start_function_call>",), "function_gemma"),
    (("<longcat_tool_call>",), "longcat"),
    (("<arg_key>",), "glm47"),
)


def tool_format_of(chat_template: object, vocab: Container[str]) -> ToolFormat | None:
    """The format the template's model writes its calls in; None: the template shows no tool
    format shoal or mlx-lm knows (a call it writes stays in its content)."""
    if isinstance(chat_template, str):
        found = _from_template(chat_template)
        if found is not None:
            return found
    # mlx-lm's fallback on the vocabulary (LFM2 conversions name the tokens only there)
    if "<|tool_call_start|>" in vocab and "<|tool_call_end|>" in vocab:
        return ToolFormat(parser="pythonic", forced=None)
    return None


def _from_template(template: str) -> ToolFormat | None:
    for markers, parser in _MLX_LM_MARKERS:
        if all(m in template for m in markers):
            return ToolFormat(parser=parser, forced=None)
    if "<|tool_list_start|>" in template or "<|tool_call_start|>" in template:
        return ToolFormat(parser="pythonic", forced=None)
    if "<tool_call>\\n<function=" in template or "<tool_call>\n<function=" in template:
        return ToolFormat(parser="qwen3_coder", forced=None)
    if "<|tool_calls_section_begin|>" in template:
        return ToolFormat(parser="kimi_k2", forced=None)
    if '<function name="' in template and '<param name="' in template:
        return ToolFormat(parser="minicpm5", forced=None)
    if "[TOOL_CALLS]" in template:
        # Mistral v0.3 templates write `[TOOL_CALLS] [{"name": ..., "arguments": ...}]`; the newer
        # ones (Mistral Small 3.2, Devstral, Magistral) `[TOOL_CALLS]name[ARGS]{...}`
        return ToolFormat(parser="mistral", forced="mistral_args" if "[ARGS]" in template else "mistral")
    if "<atem:function_calls>" in template:
        return ToolFormat(parser="muse_spark", forced=None)
    if "<tool_call>" in template and "tool_call.name" in template:
        return JSON_TOOLS
    if "ipython" in template and '"parameters": ' in template:
        return LLAMA3_JSON  # Llama 3.1 / 3.2: a bare `{"name": ..., "parameters": {...}}` answer
    return None


def special_tokens_of(tokenizer: Any) -> dict[str, int]:
    """A transformers tokenizer's (or mlx-lm's wrapper of one) special added tokens, text -> id."""
    decoder: Any = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {
        str(token.content): int(token_id) for token_id, token in decoder.items() if getattr(token, "special", False)
    }
