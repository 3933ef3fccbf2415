"""What a task's output must follow, carried in `TaskParams`: the tools its prompt offers and the
constraint the sampling rank's grammar enforces. Plain shared types, like `events.runner_settings`,
so the runner engine may speak them (tests/test_house_rules.py).
"""

from __future__ import annotations

from typing import Literal

import msgspec

# The tool-call formats a forced call can be written in (runner/models/grammar.py): mlx-lm's
# `json_tools` (`<tool_call>{...}</tool_call>`), Mistral's `[TOOL_CALLS]` in its v0.3 list form and
# its newer `name[ARGS]{...}` form, Llama 3's bare `{"name": ..., "parameters": {...}}`.
ForcedCallFormat = Literal["json_tools", "mistral", "mistral_args", "llama3_json"]


class ToolFunction(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A function the model may call, rendered into the prompt by the model's chat template."""

    name: str
    description: str = ""
    parameters: str = "{}"  # its arguments' JSON schema, as JSON text


class ConstraintBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", gc=False):
    """What the sampling rank's grammar holds the output to (structured output, forced tool calls)."""


class JsonObject(ConstraintBase, tag="json_object", frozen=True, kw_only=True):
    """Any JSON object (`response_format: json_object`)."""


class JsonSchema(ConstraintBase, tag="json_schema", frozen=True, kw_only=True):
    name: str
    schema: str  # JSON text


class ToolCallRequired(ConstraintBase, tag="tool_call", frozen=True, kw_only=True):
    """One call of one of `names` (all of `tools` for `required`, one for a named `tool_choice`),
    in the tool-call format of the model's chat template."""

    names: list[str]
    format: ForcedCallFormat = "json_tools"  # the model's, as the API read its chat template


Constraint = JsonObject | JsonSchema | ToolCallRequired
