"""The parser of a model's tool-call format (`runner/models/tool_formats.py` names it): mlx-lm's own
parser modules, reused as they are, and `llama3_json`, shoal's, written in the same shape (a
`parse_tool_call(text, tools)` between a start and an end marker) for the family mlx-lm has none for.

mlx-lm's parsers (`mlx_lm/tool_parsers/*.py`) are plain Python (json, regex, ast), but importing
them as `mlx_lm.tool_parsers.x` runs `mlx_lm/__init__.py`, which imports MLX, which only runners
load (tests/test_house_rules.py). So each is loaded from its file, under a name of its own, without
its package: the same code mlx-lm's server runs, and no MLX in the API's process.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from runner.models.tool_formats import ToolFormat

ParseToolCall = Callable[[str, Any], Any]  # mlx-lm's `parse_tool_call(text, tools)`: a call or a list of them
PYTHON_TAG = "<|python_tag|>"


class ToolParserMissing(RuntimeError):
    """mlx-lm's install lacks the parser its template inference names (a version shoal was not
    built against)."""


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class ToolParser:
    """How a format's calls are found in the text and read.

    `start` "" means a call is the whole answer (Llama 3: the answer begins with `{` or
    `<|python_tag|>`); `end` "" means a call runs to the end of the completion (Mistral)."""

    name: str
    start: str
    end: str
    parse: ParseToolCall
    short_ids: bool = False  # call ids of 9 letters and digits (Mistral's templates refuse others)

    def calls(self, body: str, tools: Sequence[dict[str, Any]]) -> list[ParsedCall] | None:
        """The calls in one call's text (None: it is not a call after all)."""
        try:
            parsed: Any = self.parse(body, list(tools))
        except (ValueError, SyntaxError, KeyError, IndexError, TypeError):  # mlx-lm's parsers raise these on bad text
            return None
        found: list[Any] = parsed if isinstance(parsed, list) else [parsed]  # pyright: ignore[reportUnknownVariableType]
        calls = [_call(c) for c in found]
        return None if not calls or any(c is None for c in calls) else [c for c in calls if c is not None]


def tool_parser(form: ToolFormat) -> ToolParser:
    if form.parser == "llama3_json":
        return ToolParser(name=form.parser, start="", end="", parse=parse_llama3_json)
    module = _mlx_lm_parser_module(form.parser)
    return ToolParser(
        name=form.parser,
        start=str(module.tool_call_start),
        end=str(module.tool_call_end),
        parse=module.parse_tool_call,
        short_ids=form.parser == "mistral",
    )


def parse_llama3_json(text: str, tools: Any = None) -> dict[str, Any] | list[dict[str, Any]]:
    """Llama 3.1/3.2's calls: `{"name": ..., "parameters": {...}}` (`arguments` also read), after
    `<|python_tag|>` or bare, several separated by `;` (as vLLM's `llama3_json` reads them)."""
    text = text.strip().removeprefix(PYTHON_TAG).strip()
    decoder = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    at = 0
    while at < len(text):
        decoded: Any = decoder.raw_decode(text, at)
        value, at = cast(tuple[object, int], decoded)
        if not isinstance(value, dict):
            raise ValueError(f"not a Llama 3 tool call: {text!r}")
        call = cast(dict[str, Any], value)
        if not isinstance(call.get("name"), str):
            raise ValueError(f"not a Llama 3 tool call: {text!r}")
        calls.append({"name": call["name"], "arguments": call.get("parameters", call.get("arguments", {}))})
        rest = text[at:].lstrip()
        if rest and not rest.startswith(";"):
            raise ValueError(f"text after a Llama 3 tool call: {rest!r}")
        at = len(text) - len(rest.removeprefix(";").lstrip())
    if not calls:
        raise ValueError("no Llama 3 tool call")
    return calls[0] if len(calls) == 1 else calls


def _call(parsed: Any) -> ParsedCall | None:
    if not isinstance(parsed, dict):
        return None
    call = cast(dict[str, Any], parsed)
    name: Any = call.get("name")
    arguments: Any = call.get("arguments", {})
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):  # a template that renders them as JSON text: keep it if it is JSON
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False, separators=(",", ":")))


def _mlx_lm_parser_module(name: str) -> Any:
    package = importlib.util.find_spec("mlx_lm")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ToolParserMissing("mlx-lm is not installed: its tool-call parsers cannot be read")
    path = Path(next(iter(package.submodule_search_locations))) / "tool_parsers" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"shoal_mlx_lm_tool_parser_{name}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ToolParserMissing(f"mlx-lm has no tool-call parser {name!r} at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
