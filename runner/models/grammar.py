"""A task's constraint as an llguidance grammar (no MLX): the API checks it before publishing, the
sampling rank compiles it against the tokenizer.

JSON is compact (no whitespace between tokens): whitespace is the one thing a grammar would let a
model repeat forever, and compact JSON parses the same. A forced tool call is written in the
`json_tools` format of mlx-lm (Hermes/Qwen 2.5 templates, the tiny model's):
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, which its parser reads back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, assert_never

import llguidance

from events.constraints import Constraint, JsonObject, JsonSchema, ToolCallRequired, ToolFunction

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_CALL_PARSER = "json_tools"  # mlx_lm.tool_parsers.<this>: the format above
_COMPACT = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A constraint no grammar can be built from (a schema llguidance refuses): the request's fault."""


def grammar_for(constraint: Constraint, tools: Sequence[ToolFunction]) -> str:
    """The llguidance grammar (its JSON form) that holds the output to `constraint`."""
    match constraint:
        case JsonObject():
            return _from_schema({"type": "object"})
        case JsonSchema(schema=schema):
            return _from_schema(_decode_schema(schema, constraint.name))
        case ToolCallRequired(names=names):
            return _tool_call_grammar([_call_schema(_tool_named(tools, name)) for name in names])
        case _:
            assert_never(constraint)


def check_grammar(grammar: str) -> None:
    """Raise `GrammarError` with llguidance's message when it cannot compile `grammar`."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise GrammarError("; ".join(messages) or "the grammar does not compile")


def _from_schema(schema: dict[str, Any]) -> str:
    return _built(
        lambda: llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False}
        )
    )


def _built(build: Callable[[], str]) -> str:
    """llguidance's refusal to build a grammar (a schema nested past its limit, say) is the
    request's fault, as one it refuses to compile."""
    try:
        return build()
    except (ValueError, RecursionError) as exc:
        raise GrammarError(
            f"llguidance cannot build a grammar from it: {exc} (nested too deeply? flatten the schema)"
        ) from exc


def _decode_schema(text: str, where: str) -> dict[str, Any]:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{where}: the schema is not JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise GrammarError(f"{where}: a JSON schema is an object, got {type(schema).__name__}")
    return schema  # pyright: ignore[reportUnknownVariableType]


def _tool_named(tools: Sequence[ToolFunction], name: str) -> ToolFunction:
    for tool in tools:
        if tool.name == name:
            return tool
    raise GrammarError(f"tool_choice names {name!r}, which is not one of the request's tools")


def _call_schema(tool: ToolFunction) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": _decode_schema(tool.parameters, tool.name)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _tool_call_grammar(calls: list[dict[str, Any]]) -> str:
    schema = {"anyOf": calls, "x-guidance": _COMPACT}
    lark = f"start: {json.dumps(TOOL_CALL_START)} call {json.dumps(TOOL_CALL_END)}\ncall: %json {json.dumps(schema)}\n"
    return _built(lambda: llguidance.LLMatcher.grammar_from_lark(lark))
