"""Tools and response formats in a chat request: their request types, and the prompt tools and
output constraint a task gets from them (`to_task` turns `ToolProblem` into a 400).

`tool_choice` "required" or a named function is enforced, not asked for: the sampling rank's
grammar allows only a call in the chat template's tool-call format (runner/models/grammar.py), so
any model returns a call whose arguments follow the function's schema. "auto" offers the tools
and parses what the model writes; "none" does not show them to the model at all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec

from events.catalogue import ToolCall
from events.constraints import Constraint, JsonObject, JsonSchema, ToolCallRequired, ToolFunction
from runner.models.grammar import GrammarError, check_grammar, grammar_for


class FunctionCall(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class RequestToolCall(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(msgspec.Struct, frozen=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]
    description: str = ""
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None  # arguments always follow `parameters` when the call is forced


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(msgspec.Struct, frozen=True, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class TextFormat(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="json_object"):
    pass


class JsonSchemaSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    description: str | None = None
    schema: dict[str, Any] | None = None  # none: any JSON object
    strict: bool | None = None  # shoal always holds the output to the schema


class JsonSchemaFormat(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class ToolProblem(ValueError):
    """Tools or a response format no task can follow; `param` names the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def task_tools_and_constraint(
    tools: Sequence[Tool], tool_choice: ToolChoice | None, response_format: ResponseFormat | None
) -> tuple[list[ToolFunction], Constraint | None]:
    """The tools the chat template shows the model, and the grammar the output must follow."""
    functions = [_task_function(t.function) for t in tools]
    choice = tool_choice if tool_choice is not None else ("auto" if functions else "none")
    if choice != "none" and not functions:
        raise ToolProblem("tool_choice asks for a tool call but the request has no tools", "tool_choice")
    forced = _forced_call(choice, functions)
    format_constraint = _format_constraint(response_format)
    if forced is not None and format_constraint is not None:
        raise ToolProblem("a forced tool call and a response_format cannot both hold: drop one", "response_format")
    constraint = forced or format_constraint
    if constraint is not None:
        try:
            check_grammar(grammar_for(constraint, functions))
        except GrammarError as exc:
            raise ToolProblem(f"cannot constrain the output: {exc}", _param_of(constraint)) from exc
    return ([] if choice == "none" else functions), constraint


def task_tool_calls(calls: Sequence[RequestToolCall], where: str) -> list[ToolCall]:
    """An assistant turn's calls as the log carries them; their arguments must be JSON."""
    for call in calls:
        try:
            json.loads(call.function.arguments)
        except json.JSONDecodeError as exc:
            raise ToolProblem(f"the arguments of tool call {call.id!r} are not JSON: {exc}", where) from exc
    return [ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in calls]


def _task_function(function: FunctionDefinition) -> ToolFunction:
    no_arguments: dict[str, Any] = {"type": "object", "properties": {}}
    parameters = function.parameters if function.parameters is not None else no_arguments
    return ToolFunction(name=function.name, description=function.description, parameters=json.dumps(parameters))


def _forced_call(choice: ToolChoice, functions: list[ToolFunction]) -> ToolCallRequired | None:
    match choice:
        case "required":
            return ToolCallRequired(names=[f.name for f in functions])
        case NamedToolChoice(function=FunctionName(name=name)):
            if all(f.name != name for f in functions):
                raise ToolProblem(f"tool_choice names {name!r}, which is not one of the tools", "tool_choice")
            return ToolCallRequired(names=[name])
        case "auto" | "none":
            return None


def _format_constraint(response_format: ResponseFormat | None) -> Constraint | None:
    match response_format:
        case None | TextFormat():
            return None
        case JsonObjectFormat():
            return JsonObject()
        case JsonSchemaFormat(json_schema=spec):
            schema: dict[str, Any] = spec.schema if spec.schema is not None else {"type": "object"}
            return JsonSchema(name=spec.name, schema=json.dumps(schema))


def _param_of(constraint: Constraint) -> str:
    return "tools" if isinstance(constraint, ToolCallRequired) else "response_format"
