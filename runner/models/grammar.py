"""A task's constraint as an llguidance grammar (no MLX): the API checks it before publishing, the
sampling rank compiles it against the tokenizer.

JSON is compact (no whitespace between tokens): whitespace is the one thing a grammar would let a
model repeat forever, and compact JSON parses the same. A forced tool call is one call, written
in the model's own format (`ToolCallRequired.format`, from its chat template:
`runner/models/tool_formats.py`), which the API's parser for that format reads back:
- `json_tools` (mlx-lm's; Hermes/Qwen 2.5 templates, the tiny model's):
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
- `mistral` (Mistral v0.3 templates): `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`
- `mistral_args` (Mistral Small 3.2, Devstral, Magistral): `[TOOL_CALLS]name[ARGS]{...}`
- `llama3_json` (Llama 3.1/3.2): `{"name": ..., "parameters": {...}}`, the whole answer
A marker that is one of the tokenizer's special tokens (Mistral's `[TOOL_CALLS]`) is written as
that token (`<[id]>`) where the sampling rank builds the grammar: llguidance masks a literal equal
to a special token's text down to that token, then refuses it. Where no tokenizer is at hand (the
API's check) the marker is its text, which checks the same schemas.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, assert_never

import llguidance

from events.constraints import (
    Constraint,
    ForcedCallFormat,
    JsonObject,
    JsonSchema,
    ToolCallRequired,
    ToolFunction,
)

MISTRAL_CALLS = "[TOOL_CALLS]"
_COMPACT = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A constraint no grammar can be built from (a schema llguidance refuses): the request's fault."""


def grammar_for(
    constraint: Constraint, tools: Sequence[ToolFunction], special_tokens: Mapping[str, int] | None = None
) -> str:
    """The llguidance grammar (its JSON form) that holds the output to `constraint`;
    `special_tokens` (text -> id) are the tokenizer's, when it is at hand."""
    match constraint:
        case JsonObject():
            return _from_schema({"type": "object"})
        case JsonSchema(schema=schema):
            return _from_schema(_decode_schema(schema, constraint.name))
        case ToolCallRequired(names=names, format=form):
            return _tool_call_grammar(form, [_tool_named(tools, name) for name in names], special_tokens or {})
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


def _call_schema(tool: ToolFunction, arguments_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: _decode_schema(tool.parameters, tool.name)},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _json_rule(schemas: list[dict[str, Any]]) -> str:
    return f"%json {json.dumps({'anyOf': schemas, 'x-guidance': _COMPACT})}"


def _marker(text: str, special_tokens: Mapping[str, int]) -> str:
    """`text` in lark: the special token it is, else the text."""
    token = special_tokens.get(text)
    return json.dumps(text) if token is None else f"<[{token}]>"


def _tool_call_grammar(form: ForcedCallFormat, tools: list[ToolFunction], special_tokens: Mapping[str, int]) -> str:
    """A lark grammar of one call of one of `tools`, in `form`."""
    match form:
        case "json_tools":
            call = _json_rule([_call_schema(t, "arguments") for t in tools])
            start, end = _marker("<tool_call>", special_tokens), _marker("</tool_call>", special_tokens)
            lark = f"start: {start} call {end}\ncall: {call}\n"
        case "mistral":
            call = _json_rule([_call_schema(t, "arguments") for t in tools])
            lark = f'start: {_marker(MISTRAL_CALLS, special_tokens)} "[" call "]"\ncall: {call}\n'
        case "mistral_args":
            # one alternative per tool: its name, then its arguments' schema
            names = [f"call{i}" for i in range(len(tools))]
            rules = [
                f"{rule}: {json.dumps(t.name + '[ARGS]')} "
                f"%json {json.dumps({**_decode_schema(t.parameters, t.name), 'x-guidance': _COMPACT})}"
                for rule, t in zip(names, tools, strict=True)
            ]
            lark = f"start: {_marker(MISTRAL_CALLS, special_tokens)} ({' | '.join(names)})\n" + "\n".join(rules) + "\n"
        case "llama3_json":
            lark = f"start: call\ncall: {_json_rule([_call_schema(t, 'parameters') for t in tools])}\n"
        case _:
            assert_never(form)
    return _built(lambda: llguidance.LLMatcher.grammar_from_lark(lark))
