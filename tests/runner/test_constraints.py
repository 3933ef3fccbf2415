"""Constrained decoding in one engine on the tiny random model: the grammar alone makes its noise
valid JSON or a valid tool call, a cut answer says `length`, a refused schema is a request error,
and logprobs under a grammar are of the masked distribution the sampler drew from."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import jsonschema
import pytest

from events.constraints import ForcedCallFormat, JsonSchema, ToolCallRequired, ToolFunction
from events.runner_settings import RunnerSettings
from runner.engine.engine import Engine
from runner.engine.protocols import RunnerSink
from runner.engine.requests import GenerationOutcome, GenerationRequest
from runner.engine.shard import ShardPlacement
from runner.errors import RequestError
from runner.local.testing.tools import RecordingSink
from runner.models.chat import encode_chat
from runner.models.tiny import cached_tiny
from runner.models.tiny_families import Family, make_tiny_family
from runner.models.tool_formats import tool_format_of
from runner.shard_loading import load_shard
from services.api.tool_calls import ToolCallSplitter, split_text
from services.api.tool_parsers import tool_parser
from tests.runner.harness import served_alone

SCHEMA = {
    "type": "object",
    "properties": {"word": {"enum": ["cat", "dog"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["word", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    placement = ShardPlacement(rank=0, world=1, layer_ranges=((0, 8),))
    yield Engine(None, load_shard(cached_tiny(), placement, None), RunnerSettings())


def _generate(engine: Engine, max_tokens: int, sink: RunnerSink | None = None, **request: object) -> GenerationOutcome:
    prompt = encode_chat(engine.tokenizer, [{"role": "user", "content": "hello"}])
    asked = GenerationRequest(task_id="t", prompt_token_ids=prompt, max_tokens=max_tokens, **request)  # pyright: ignore[reportArgumentType]
    return served_alone(engine, asked, sink)


def test_the_schema_holds_and_the_answer_ends_at_eos(engine: Engine) -> None:
    free = _generate(engine, 24)
    with pytest.raises(json.JSONDecodeError):
        json.loads(free.text)  # the model alone writes noise
    held = _generate(engine, 64, constraint=JsonSchema(name="s", schema=json.dumps(SCHEMA)))
    assert held.finish_reason == "stop"
    jsonschema.validate(json.loads(held.text), SCHEMA)


def test_a_cut_answer_says_length(engine: Engine) -> None:
    cut = _generate(engine, 2, constraint=JsonSchema(name="s", schema=json.dumps(SCHEMA)))
    assert cut.finish_reason == "length" and cut.text.startswith("{")


def test_logprobs_under_a_grammar_are_of_the_masked_distribution(engine: Engine) -> None:
    """What OpenAI reports for structured output: the alternatives are only tokens the grammar
    allows (a refused one would be -inf), renormalized over them, so a token the grammar forces,
    such as the opening brace, has logprob 0 whatever the model thought of it."""
    sink = RecordingSink()
    held = _generate(engine, 64, sink, constraint=JsonSchema(name="s", schema=json.dumps(SCHEMA)), logprobs=5)
    assert [lp.token_id for lp in sink.logprobs] == held.token_ids
    assert sink.logprobs[0].token == "{" and sink.logprobs[0].logprob == pytest.approx(0.0, abs=1e-4)
    for lp in sink.logprobs:
        tops = [t.logprob for t in lp.top]
        assert 1 <= len(tops) <= 5 and all(v > -math.inf for v in [lp.logprob, *tops])
        assert sum(math.exp(v) for v in tops) <= 1.0 + 1e-3
    assert len(sink.logprobs[0].top) == 1  # the brace was the only token allowed


def test_a_forced_call_names_a_tool_and_follows_its_schema(engine: Engine) -> None:
    tool = ToolFunction(name="pick", parameters=json.dumps(SCHEMA))
    call = _generate(engine, 96, constraint=ToolCallRequired(names=["pick"]), tools=[tool])
    body = call.text.removeprefix("<tool_call>").removesuffix("</tool_call>")
    assert call.finish_reason == "stop" and body != call.text
    parsed = json.loads(body)
    assert parsed["name"] == "pick"
    jsonschema.validate(parsed["arguments"], SCHEMA)


def test_a_schema_llguidance_refuses_is_a_request_error_on_every_rank(engine: Engine) -> None:
    bad = JsonSchema(name="s", schema=json.dumps({"type": "nonsense"}))
    prompt = encode_chat(engine.tokenizer, [{"role": "user", "content": "hello"}])
    with pytest.raises(RequestError, match="cannot constrain the output"):
        engine.validate(GenerationRequest(task_id="t", prompt_token_ids=prompt, max_tokens=4, constraint=bad))


def test_a_forced_call_in_a_format_the_template_does_not_write_is_a_request_error(engine: Engine) -> None:
    """The tiny model's template writes `json_tools`: a forced call the API asked in Mistral's
    format (it read another template) is refused on every rank, never written in a format the
    API would then read wrong."""
    tool = ToolFunction(name="pick", parameters=json.dumps(SCHEMA))
    prompt = encode_chat(engine.tokenizer, [{"role": "user", "content": "hello"}])
    forced = ToolCallRequired(names=["pick"], format="mistral")
    asked = GenerationRequest(task_id="t", prompt_token_ids=prompt, max_tokens=4, constraint=forced, tools=[tool])
    with pytest.raises(RequestError, match="in the mistral format, but this model's chat template writes json_tools"):
        engine.validate(asked)


@pytest.mark.parametrize(("family", "form"), [("llama3", "llama3_json"), ("mistral", "mistral")])
def test_a_forced_call_is_written_in_the_families_format_and_read_back(
    tmp_path_factory: pytest.TempPathFactory, family: Family, form: ForcedCallFormat
) -> None:
    """The random model of a family, held by the grammar, writes one call its format's parser reads."""
    directory = make_tiny_family(tmp_path_factory.mktemp(family), family)
    placement = ShardPlacement(rank=0, world=1, layer_ranges=((0, 8),))
    family_engine = Engine(None, load_shard(directory, placement, None), RunnerSettings())
    tool = ToolFunction(name="pick", parameters=json.dumps(SCHEMA))
    call = _generate(family_engine, 96, constraint=ToolCallRequired(names=["pick"], format=form), tools=[tool])
    assert call.finish_reason == "stop", call.text
    found = tool_format_of(family_engine.tokenizer.chat_template, ())
    assert found is not None
    split = split_text(ToolCallSplitter(parser=tool_parser(found), call_id=str), call.text)
    assert split.content == "" and [c.name for c in split.calls] == ["pick"]
    jsonschema.validate(json.loads(split.calls[0].arguments), SCHEMA)
