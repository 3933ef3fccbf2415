"""Tool-call formats: which one a chat template names (as mlx-lm chooses), each format's calls read
back by its parser (mlx-lm's own, or shoal's `llama3_json`) as the text streams in, and a forced
call's grammar in each format accepting exactly the calls its parser reads."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.constraints import ForcedCallFormat, ToolCallRequired, ToolFunction
from runner.models.grammar import check_grammar, grammar_for
from runner.models.tiny_families import Family, chat_template, make_tiny_family
from runner.models.tiny_tokenizer import CHAT_TEMPLATE
from runner.models.tool_formats import JSON_TOOLS, LLAMA3_JSON, ToolFormat, special_tokens_of, tool_format_of
from services.api.tool_calls import Split, ToolCallSplitter, call_ids, split_text
from services.api.tool_parsers import ToolParser, parse_llama3_json, tool_parser

WEATHER = ToolFunction(
    name="get_weather",
    parameters=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
TIME = ToolFunction(name="get_time", parameters=json.dumps({"type": "object", "properties": {}}))
MISTRAL = ToolFormat(parser="mistral", forced="mistral")
MISTRAL_ARGS = ToolFormat(parser="mistral", forced="mistral_args")


class _Tokenizer:
    """What mlx-lm's `_infer_tool_parser` reads of a tokenizer."""

    def __init__(self, template: str | None, vocab: dict[str, int] | None = None) -> None:
        self.chat_template = template
        self.vocab = vocab or {}

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


# templates cut down to the markers mlx-lm looks for, with the parser it names
MLX_LM_TEMPLATES = [
    ("{{ '<minimax:tool_call>' }}", "minimax_m2"),
    ("<|tool_call>{{ x }}<tool_call|>", "gemma4"),
    ("<start_function_call>", "function_gemma"),
    ("<longcat_tool_call>", "longcat"),
    ("<arg_key>", "glm47"),
    ("<|tool_call_start|>", "pythonic"),
    ("<tool_call>\n<function={{ tool_call.name }}>", "qwen3_coder"),
    ("<|tool_calls_section_begin|>", "kimi_k2"),
    ('<function name="x"><param name="y">', "minicpm5"),
    ("[TOOL_CALLS] [{{ tool_call | tojson }}]", "mistral"),
    ("[TOOL_CALLS]{{ name }}[ARGS]{{ arguments }}", "mistral"),
    ("<atem:function_calls>", "muse_spark"),
    (CHAT_TEMPLATE, "json_tools"),
]


@pytest.mark.parametrize(("template", "parser"), MLX_LM_TEMPLATES)
def test_a_template_names_the_parser_mlx_lm_names(template: str, parser: str) -> None:
    from mlx_lm.tokenizer_utils import _infer_tool_parser  # pyright: ignore[reportPrivateUsage]

    assert _infer_tool_parser(_Tokenizer(template)) == parser
    found = tool_format_of(template, {})
    assert found is not None and found.parser == parser


@pytest.mark.parametrize(
    ("family", "expected"),
    [("llama3", LLAMA3_JSON), ("mistral", MISTRAL), ("qwen3", JSON_TOOLS), ("qwen3-thinking", JSON_TOOLS)],
)
def test_the_tiny_families_templates_name_their_format(family: Family, expected: ToolFormat) -> None:
    assert tool_format_of(chat_template(family), {}) == expected


def test_no_known_format_is_none_and_the_vocabulary_is_mlx_lms_fallback() -> None:
    assert tool_format_of("{{ messages }}", {}) is None
    assert tool_format_of(None, {}) is None
    fallback = tool_format_of(None, {"<|tool_call_start|>": 1, "<|tool_call_end|>": 2})
    assert fallback == ToolFormat(parser="pythonic", forced=None)


def test_mlx_lms_parsers_are_read_without_loading_mlx() -> None:
    probe = (
        "import sys\n"
        "from runner.models.tool_formats import ToolFormat\n"
        "from services.api.tool_parsers import tool_parser\n"
        "for name in ('json_tools', 'mistral', 'pythonic', 'qwen3_coder', 'function_gemma', 'llama3_json'):\n"
        "    tool_parser(ToolFormat(parser=name, forced=None))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def _splitter(form: ToolFormat, max_calls: int | None = None) -> ToolCallSplitter:
    tools = [
        {"type": "function", "function": {"name": t.name, "parameters": json.loads(t.parameters)}}
        for t in (WEATHER, TIME)
    ]
    return ToolCallSplitter(parser=tool_parser(form), call_id=lambda n: f"call_{n}", tools=tools, max_calls=max_calls)


def _calls(split: Split) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in split.calls]


# (format, the model's text, the content left, the calls read)
READ_BACK: list[tuple[ToolFormat, str, str, list[tuple[str, Any]]]] = [
    (
        JSON_TOOLS,
        'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        "Sure.",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        MISTRAL,
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]',
        "",
        [("get_weather", {"city": "Oslo"}), ("get_time", {})],
    ),
    (
        MISTRAL_ARGS,
        'Let me look.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
        "Let me look.",
        [("get_weather", {"city": "Rome"})],
    ),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Lima"}}', "", [("get_weather", {"city": "Lima"})]),
    (LLAMA3_JSON, ' <|python_tag|>{"name": "get_time", "parameters": {}}', "", [("get_time", {})]),
    (
        LLAMA3_JSON,
        '{"name": "get_weather", "parameters": {"city": "A"}}; {"name": "get_time", "arguments": {}}',
        "",
        [("get_weather", {"city": "A"}), ("get_time", {})],
    ),
    (LLAMA3_JSON, 'The answer is {"name": "x", "parameters": {}}', 'The answer is {"name": "x", "parameters": {}}', []),
    (LLAMA3_JSON, '{"answer": 42}', '{"answer": 42}', []),  # JSON, but not a call: the model's content
    (LLAMA3_JSON, "Paris is sunny.", "Paris is sunny.", []),
    (
        ToolFormat(parser="pythonic", forced=None),
        '<|tool_call_start|>[get_weather(city="Bern")]<|tool_call_end|>ok',
        "ok",
        [("get_weather", {"city": "Bern"})],
    ),
    (
        ToolFormat(parser="qwen3_coder", forced=None),
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nBonn\n</parameter>\n</function>\n</tool_call>",
        "",
        [("get_weather", {"city": "Bonn"})],
    ),
    (MISTRAL, "[TOOL_CALLS] not json at all", "[TOOL_CALLS] not json at all", []),
    (JSON_TOOLS, "a < b <tool_call>[1, 2]</tool_call>", "a < b <tool_call>[1, 2]</tool_call>", []),
]


@pytest.mark.parametrize(("form", "text", "content", "calls"), READ_BACK)
def test_each_format_is_read_back_by_its_parser(form: ToolFormat, text: str, content: str, calls: list[Any]) -> None:
    split = split_text(_splitter(form), text)
    assert (split.content, _calls(split)) == (content, calls)


@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
@pytest.mark.parametrize(("form", "text", "content", "calls"), READ_BACK)
def test_the_pieces_a_stream_arrives_in_change_nothing(
    form: ToolFormat, text: str, content: str, calls: list[Any], cuts: list[int]
) -> None:
    splitter = _splitter(form)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    pieces = [splitter.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    pieces.append(splitter.finish())
    streamed = Split(content="".join(p.content for p in pieces), calls=[c for p in pieces for c in p.calls])
    assert (streamed.content, _calls(streamed)) == (content, calls)


def test_half_a_marker_is_never_released_as_content() -> None:
    splitter = _splitter(MISTRAL)
    assert splitter.feed("Hi [TOOL_").content == "Hi "
    assert splitter.feed("CALLS]").content == ""
    llama = _splitter(LLAMA3_JSON)
    assert llama.feed("  <|python").content == ""  # may begin a call: held
    assert llama.feed('_tag|>{"name"').content == ""


@pytest.mark.parametrize("form", [JSON_TOOLS, MISTRAL, LLAMA3_JSON])
def test_max_calls_keeps_the_first_and_drops_what_follows(form: ToolFormat) -> None:
    two = {
        "json_tools": '<tool_call>{"name": "get_time", "arguments": {}}</tool_call> and <tool_call>{"name": "get_weather", "arguments": {"city": "X"}}</tool_call> done',
        "mistral": '[TOOL_CALLS] [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "X"}}]',
        "llama3_json": '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "X"}}',
    }[str(form.forced)]
    split = split_text(_splitter(form, max_calls=1), two)
    assert _calls(split) == [("get_time", {})]
    assert split.content == ""


def test_mistral_call_ids_are_nine_letters_and_digits_and_distinct() -> None:
    ids = call_ids("call_", "task-1", tool_parser(MISTRAL))
    made = [ids(n) for n in range(50)]
    assert all(len(i) == 9 and i.isalnum() for i in made) and len(set(made)) == 50
    assert call_ids("call_", "task-1", tool_parser(JSON_TOOLS))(3) == "call_task-1_3"


def test_llama3_parser_refuses_what_is_not_a_call() -> None:
    for text in ("", "[1]", '{"parameters": {}}', '{"name": "f"} trailing'):
        with pytest.raises(ValueError):
            parse_llama3_json(text)


# --- the grammar of a forced call, per format ------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from transformers import AutoTokenizer

    made: dict[str, Any] = {}
    for family in ("qwen3", "llama3", "mistral"):
        directory = make_tiny_family(tmp_path_factory.mktemp(family), family)  # pyright: ignore[reportArgumentType]
        made[family] = AutoTokenizer.from_pretrained(str(directory))  # pyright: ignore[reportUnknownMemberType]
    return made


FAMILY_OF: dict[ForcedCallFormat, str] = {
    "json_tools": "qwen3",
    "mistral": "mistral",
    "mistral_args": "mistral",
    "llama3_json": "llama3",
}
# (format, text the grammar must accept, text it must refuse)
FORCED: list[tuple[ForcedCallFormat, str, str]] = [
    (
        "json_tools",
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
        '<tool_call>{"name":"other","arguments":{}}</tool_call>',
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Paris"}}]',
        '[TOOL_CALLS][{"name":"get_weather","arguments":{}}]',
    ),
    ("mistral_args", '[TOOL_CALLS]get_weather[ARGS]{"city":"Paris"}', '[TOOL_CALLS]get_weather[ARGS]{"town":"Paris"}'),
    (
        "llama3_json",
        '{"name":"get_weather","parameters":{"city":"Paris"}}',
        '{"name":"get_weather","arguments":{"city":"Paris"}}',
    ),
]


def _accepts(tokenizer: Any, grammar: str, text: str) -> bool:
    """Whether the grammar's mask allows `text`, token by token as the tokenizer writes it (its
    special tokens as themselves), and then only the end: what the sampling rank does."""
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
    bitmask = llguidance.numpy.allocate_token_bitmask(1, lltok.vocab_size)
    for token in tokenizer.encode(text, add_special_tokens=False):
        llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, 0)
        allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little")
        if not allowed[token] or not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


@pytest.mark.parametrize(("form", "good", "bad"), FORCED)
def test_a_forced_call_grammar_takes_the_format_and_its_parser_reads_it(
    tokenizers: dict[str, Any], form: ForcedCallFormat, good: str, bad: str
) -> None:
    tokenizer = tokenizers[FAMILY_OF[form]]
    forced = ToolCallRequired(names=["get_weather"], format=form)
    check_grammar(grammar_for(forced, [WEATHER, TIME]))  # as the API checks it, without the tokenizer
    grammar = grammar_for(forced, [WEATHER, TIME], special_tokens_of(tokenizer))
    assert _accepts(tokenizer, grammar, good)
    assert not _accepts(tokenizer, grammar, bad)
    parser_format = {
        "json_tools": JSON_TOOLS,
        "mistral": MISTRAL,
        "mistral_args": MISTRAL_ARGS,
        "llama3_json": LLAMA3_JSON,
    }[form]
    assert _calls(split_text(_splitter(parser_format), good)) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("form", ["json_tools", "mistral", "mistral_args", "llama3_json"])
def test_required_allows_any_offered_tool(tokenizers: dict[str, Any], form: ForcedCallFormat) -> None:
    tokenizer = tokenizers[FAMILY_OF[form]]
    forced = ToolCallRequired(names=["get_weather", "get_time"], format=form)
    grammar = grammar_for(forced, [WEATHER, TIME], special_tokens_of(tokenizer))
    text = {
        "json_tools": '<tool_call>{"name":"get_time","arguments":{}}</tool_call>',
        "mistral": '[TOOL_CALLS][{"name":"get_time","arguments":{}}]',
        "mistral_args": "[TOOL_CALLS]get_time[ARGS]{}",
        "llama3_json": '{"name":"get_time","parameters":{}}',
    }[form]
    assert _accepts(tokenizer, grammar, text)


def test_parser_shapes_are_mlx_lms() -> None:
    parser: ToolParser = tool_parser(JSON_TOOLS)
    assert (parser.start, parser.end) == ("<tool_call>", "</tool_call>")
    assert (tool_parser(MISTRAL).start, tool_parser(MISTRAL).end) == ("[TOOL_CALLS]", "")


def test_a_forced_call_takes_the_models_format_or_is_a_400_naming_tool_choice(tmp_path: Path) -> None:
    from services.api.prompts import load_prompt_model, model_tool_parser, with_forced_format
    from services.api.schemas import RequestProblem

    forced = ToolCallRequired(names=["get_weather"])
    mistral = load_prompt_model(make_tiny_family(tmp_path / "mistral", "mistral"))
    assert with_forced_format(mistral, forced).format == "mistral"
    assert with_forced_format(None, forced).format == "json_tools"  # no template here: the runner checks
    parser = model_tool_parser(None)
    assert parser is not None and parser.name == "json_tools"
    assert mistral is not None
    pythonic = dataclasses.replace(mistral, tool_format=ToolFormat(parser="pythonic", forced=None))
    with pytest.raises(RequestProblem) as raised:
        with_forced_format(pythonic, forced)
    assert (raised.value.status, raised.value.param) == (400, "tool_choice")
    assert "pythonic" in raised.value.message and '"auto"' in raised.value.message
    unknown = dataclasses.replace(mistral, tool_format=None)
    with pytest.raises(RequestProblem, match="no tool-call format shoal knows"):
        with_forced_format(unknown, forced)
