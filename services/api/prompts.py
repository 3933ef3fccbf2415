"""What the API checks a prompt against before publishing it, so that a prompt no runner could take
is a 400 and never a failed task: the served model's own chat template, rendered with its
tokenizer exactly as the runner will render it (`runner/models/chat.py`), and its context length.

Both come from the model's directory when it is on this machine; loading a tokenizer blocks, so it
runs in a thread, once per model. A model whose directory is elsewhere gets an estimate of the
prompt's size only, and its template is met first by the runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from jinja2.exceptions import TemplateError
from loguru import logger

from events.catalogue import ChatMessage, RawPrompt
from events.constraints import ToolCallRequired, ToolFunction
from runner.errors import ModelDirError
from runner.models.chat import encode_task_prompt
from runner.models.model_info import read_model_info
from runner.models.tool_formats import JSON_TOOLS, ToolFormat, tool_format_of
from services.api.reasoning import ReasoningMarkers, has_thinking_switch, markers_of
from services.api.schemas import RequestProblem
from services.api.tool_parsers import ToolParser, tool_parser

CHARS_PER_TOKEN = 4  # the estimate where no tokenizer is at hand


@dataclass(frozen=True, slots=True)
class PromptModel:
    tokenizer: Any  # a transformers tokenizer, as mlx-lm's wrapper holds it
    context_length: int | None
    reasoning: ReasoningMarkers | None = None  # a thinking model's markers: its reasoning is split from its answer
    thinking_switch: bool = False  # its chat template reads `enable_thinking`
    tool_format: ToolFormat | None = None  # the tool-call format its chat template writes (None: none known)
    tool_parser: ToolParser | None = None  # that format's parser


def load_prompt_model(model_dir: Path) -> PromptModel | None:
    """The model's tokenizer and context; None (with a warning) when the directory has no usable
    model, which the master reports when it places it."""
    from services.log_routing import import_transformers

    transformers = import_transformers()  # lazy: seconds to import, and only once a model is known
    try:
        info = read_model_info(model_dir)
        tokenizer: Any = transformers.AutoTokenizer.from_pretrained(str(model_dir))  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    except (ModelDirError, OSError, ValueError) as exc:
        logger.warning("cannot check prompts against {}: {}", model_dir, exc)
        return None
    tools = tool_format_of(getattr(tokenizer, "chat_template", None), tokenizer.get_vocab())
    return PromptModel(
        tokenizer=tokenizer,
        context_length=info.context_length,
        reasoning=markers_of(tokenizer),
        thinking_switch=has_thinking_switch(tokenizer),
        tool_format=tools,
        tool_parser=None if tools is None else tool_parser(tools),
    )


def model_tool_format(model: PromptModel | None) -> ToolFormat | None:
    """The format a model's calls are read and forced in. One whose template this API cannot read
    (its directory is on another machine) is taken to write `json_tools`, the tiny model's and
    Hermes/Qwen 2.5's; a runner whose template says otherwise refuses a forced call (engine.py)."""
    return JSON_TOOLS if model is None else model.tool_format


def model_tool_parser(model: PromptModel | None) -> ToolParser | None:
    if model is None:
        return tool_parser(JSON_TOOLS)
    return model.tool_parser


def with_forced_format(model: PromptModel | None, constraint: ToolCallRequired) -> ToolCallRequired:
    """A forced call in the model's own format; a format shoal has no grammar for is a 400."""
    form = model_tool_format(model)
    if form is None or form.forced is None:
        writes = "no tool-call format shoal knows" if form is None else f"the {form.parser} format"
        raise RequestProblem(
            400,
            f"this model's chat template writes {writes}, which shoal cannot force by grammar: "
            'use tool_choice "auto" (its calls are still read), or a model in the json_tools, Mistral or Llama 3 format',
            param="tool_choice",
            code="unsupported_parameter",
        )
    return msgspec.structs.replace(constraint, format=form.forced)


def prompt_tokens(
    model: PromptModel | None,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolFunction],
    raw_prompt: RawPrompt | None,
    enable_thinking: bool | None = None,
) -> int:
    """The prompt's size in tokens as the runner will see it: the raw prompt as it is, or the
    messages and tools in the chat template."""
    if isinstance(raw_prompt, list):
        _check_token_ids(model, raw_prompt)
        return len(raw_prompt)
    if model is None:
        texts = [raw_prompt] if raw_prompt is not None else [m.content for m in messages]
        return sum(len(text) // CHARS_PER_TOKEN + 1 for text in texts)
    try:
        ids = encode_task_prompt(model.tokenizer, messages, tools, raw_prompt, enable_thinking)
    except TemplateError as exc:
        raise RequestProblem(
            400,
            f"the model's chat template refuses these messages: {exc}",
            param="messages",
            code="chat_template_refused",
        ) from exc
    return len(ids)


def _check_token_ids(model: PromptModel | None, ids: list[int]) -> None:
    """Token ids the model has no embedding for are refused here, not met by a runner."""
    vocabulary = len(model.tokenizer) if model is not None else None
    if vocabulary is not None and any(i >= vocabulary for i in ids):
        raise RequestProblem(
            400, f"the prompt has token ids outside the model's vocabulary of {vocabulary}", param="prompt"
        )


def check_logit_bias(model: PromptModel | None, bias: Sequence[tuple[int, float]]) -> None:
    """A bias on a token the model does not have is refused here, as a prompt's token id is."""
    vocabulary = len(model.tokenizer) if model is not None else None
    outside = [token for token, _ in bias if vocabulary is not None and token >= vocabulary]
    if outside:
        raise RequestProblem(
            400,
            f"logit_bias names token ids outside the model's vocabulary of {vocabulary}: {', '.join(map(str, outside[:5]))}",
            param="logit_bias",
        )


def check_thinking_switch(model: PromptModel | None) -> None:
    """`reasoning_effort` turns a thinking model's switch (`enable_thinking`) on or off: a model
    whose template has none, or whose template the API cannot read, would silently ignore it."""
    if model is None:
        raise RequestProblem(
            400,
            "reasoning_effort needs the model's chat template, which this API cannot read (its directory is on "
            "another machine): leave reasoning_effort out",
            param="reasoning_effort",
            code="unsupported_parameter",
        )
    if not model.thinking_switch:
        raise RequestProblem(
            400,
            "this model's chat template has no thinking switch (enable_thinking): leave reasoning_effort out",
            param="reasoning_effort",
            code="unsupported_parameter",
        )


def stop_tokens(model: PromptModel | None, stop: Sequence[str]) -> int:
    """The stop strings' size: the sampling rank holds and matches them, so they count against the
    prompt limit as the prompt does."""
    if model is None:
        return sum(len(s) // CHARS_PER_TOKEN + 1 for s in stop)
    return sum(len(model.tokenizer.encode(s, add_special_tokens=False)) for s in stop)


def check_prompt_size(model: PromptModel | None, tokens: int, param: str) -> None:
    """The runner refuses an empty prompt (nothing to start from: `"prompt": ""` with a tokenizer
    that adds no BOS) and one longer than the model's context; say so before it gets there."""
    if tokens == 0:
        raise RequestProblem(400, "the prompt is empty once tokenized: give it at least one token", param=param)
    if model is not None and model.context_length is not None and tokens > model.context_length:
        raise RequestProblem(
            400,
            f"the prompt has {tokens} tokens but the model's context is {model.context_length}: shorten it",
            param=param,
            code="context_length_exceeded",
        )
