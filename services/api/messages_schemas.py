"""Request bodies of Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`),
decoded strictly with msgspec at the edge and turned into the same `ChatMessage`s and `TaskParams`
a chat completion becomes: one serving path, two wire formats.

How the blocks map onto a chat:
- `system` (a string or text blocks) is the first message, role "system";
- an assistant turn's text and `tool_use` blocks are one assistant message with `tool_calls`
  (each call's `input` as JSON text, as the chat template takes it);
- a user turn's `tool_result` blocks are "tool" messages answering their `tool_use_id`, before
  the turn's text (they answer the assistant turn just before it), which is one user message;
- `tools` are chat's function tools (`input_schema` is the parameters' schema), and `tool_choice`
  is chat's: auto -> "auto", any -> "required", tool -> the named function, none -> "none"; "any"
  and "tool" are enforced by grammar as chat's are (services/api/tools.py).

What Anthropic defines and shoal cannot do is refused by name (`UNSUPPORTED_MESSAGES_FIELDS`, and
content blocks other than text / tool_use / tool_result by the decoder): never silently dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from events.catalogue import ChatMessage, TaskParams, ToolCall
from events.constraints import Constraint, ToolFunction
from services.api.schemas import MAX_STOP_BYTES, MAX_TOP_K, RequestProblem, field_of, refuse_unsupported
from services.api.tools import (
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    Tool,
    ToolChoice,
    ToolProblem,
    task_tools_and_constraint,
)

MAX_STOP_SEQUENCES = 16  # bounded by count as well as bytes (MAX_STOP_BYTES): matched on every token
# Anthropic's default temperature when a request leaves it out, as Anthropic's clients expect (chat's is 0)
ANTHROPIC_DEFAULT_TEMPERATURE = 1.0

# Anthropic request fields shoal does not implement, each with the values that ask for nothing
# more than leaving it out (JSON null always means left out); any other value is a 400 naming it.
UNSUPPORTED_MESSAGES_FIELDS: Mapping[str, tuple[object, ...]] = {
    "thinking": ({"type": "disabled"},),  # no extended thinking: the served models' reasoning is not split out
    "container": (),
    "mcp_servers": ([],),
    "context_management": (),
    "output_config": ({},),
    "output_format": (),
    "inference_geo": (),
    "speed": ("standard",),
    "diagnostics": (),
    "user_profile_id": (),
    "workspace_id": (),
}

NonEmptyText = Annotated[str, msgspec.Meta(min_length=1)]
ToolName = Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9_-]{1,128}$")]


class CacheControl(msgspec.Struct, frozen=True, kw_only=True):
    """Accepted and needs nothing: shoal's prefix cache reuses any prompt prefix it still holds."""

    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl | None = None


class ToolUseBlock(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="tool_use"):
    id: NonEmptyText
    name: NonEmptyText
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="tool_result"):
    tool_use_id: NonEmptyText
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content or [])
        return f"Error: {body}" if self.is_error else body


ContentBlock = TextBlock | ToolUseBlock | ToolResultBlock


class InputMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class CustomTool(msgspec.Struct, frozen=True, kw_only=True):
    """A client tool; Anthropic's server tools (web search, bash, ...) have other `type`s, refused."""

    name: ToolName
    input_schema: dict[str, Any]
    description: str = ""
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoiceAuto(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="auto"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="any"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="tool"):
    name: NonEmptyText
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="none"):
    pass


MessagesToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class Metadata(msgspec.Struct, frozen=True, kw_only=True):
    user_id: str | None = None  # accepted; the task's owner is its API key's id, not this


class CountTokensRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What decides a prompt's size: `/v1/messages/count_tokens` takes this, a create takes more."""

    model: str
    messages: Annotated[list[InputMessage], msgspec.Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[CustomTool] | None = None
    tool_choice: MessagesToolChoice | None = None
    cache_control: CacheControl | None = None


class MessagesRequest(CountTokensRequest, frozen=True, kw_only=True):
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    stop_sequences: Annotated[list[NonEmptyText], msgspec.Meta(max_length=MAX_STOP_SEQUENCES)] | None = None
    stream: bool | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_K)] | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: either is served alike


R = TypeVar("R")

_messages_decoder = msgspec.json.Decoder(MessagesRequest)
_count_decoder = msgspec.json.Decoder(CountTokensRequest)
_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])


def decode_messages_request(body: bytes) -> MessagesRequest:
    return _decode(body, _messages_decoder)


def decode_count_tokens_request(body: bytes) -> CountTokensRequest:
    return _decode(body, _count_decoder)


def _decode(body: bytes, decoder: msgspec.json.Decoder[R]) -> R:
    try:
        request = decoder.decode(body)
        refuse_unsupported(_fields_decoder.decode(body), UNSUPPORTED_MESSAGES_FIELDS, _WHY)
    except msgspec.ValidationError as exc:
        param = field_of(exc)
        raise RequestProblem(400, f"invalid request body: {exc}{_hint_for(param)}", param=param) from exc
    except msgspec.DecodeError as exc:
        raise RequestProblem(400, f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # msgspec's bound on nesting, whatever field it is in
        raise RequestProblem(400, f"request body is nested too deeply: {exc}") from exc
    return request


_BLOCK_TYPE = re.compile(r"^(messages\[\d+\]\.content\[\d+\]|system\[\d+\])(\.content\[\d+\])?\.type$")
_TOOL_TYPE = re.compile(r"^tools\[\d+\]\.type$")
BLOCKS_HINT = (
    "; shoal serves text models: a content block is text, tool_use or tool_result "
    "(image, document, search_result, thinking and server-tool blocks are not supported)"
)
TOOLS_HINT = (
    "; shoal runs client tools only ({name, description, input_schema}): Anthropic's server tools "
    "(web search, code execution, bash, text editor, ...) are not available"
)


def _hint_for(param: str | None) -> str:
    if param is None:
        return ""
    if _BLOCK_TYPE.match(param):
        return BLOCKS_HINT
    return TOOLS_HINT if _TOOL_TYPE.match(param) else ""


_WHY = {
    "thinking": "; extended thinking is not supported by this server's models",
    "output_config": "; structured output is served on /v1/chat/completions (response_format)",
}


# --- to a task -------------------------------------------------------------------------------


def chat_messages(request: CountTokensRequest) -> list[ChatMessage]:
    """The conversation as the chat template takes it (see the module's docstring)."""
    system = request.system
    system_text = system if isinstance(system, str) or system is None else "".join(b.text for b in system)
    messages = [ChatMessage(role="system", content=system_text)] if system_text else []
    for index, message in enumerate(request.messages):
        messages += _turn(message, f"messages[{index}]")
    return messages


def _turn(message: InputMessage, where: str) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, content=message.content)]
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    for index, block in enumerate(message.content):
        at = f"{where}.content[{index}]"
        match block:
            case TextBlock(text=text):
                texts.append(text)
            case ToolUseBlock() if message.role != "assistant":
                raise RequestProblem(400, f"{at}: a tool_use block belongs in an assistant turn", param=at)
            case ToolUseBlock(id=call_id, name=name, input=arguments):
                calls.append(ToolCall(id=call_id, name=name, arguments=json.dumps(arguments)))
            case ToolResultBlock() if message.role != "user":
                raise RequestProblem(400, f"{at}: a tool_result block belongs in a user turn", param=at)
            case ToolResultBlock(tool_use_id=call_id):
                results.append(ChatMessage(role="tool", content=block.text(), tool_call_id=call_id))
    text = "".join(texts)
    if message.role == "assistant":
        return [ChatMessage(role="assistant", content=text, tool_calls=calls)]
    return [*results, ChatMessage(role="user", content=text)] if texts or not results else results


def tools_and_constraint(request: CountTokensRequest) -> tuple[list[ToolFunction], Constraint | None]:
    """Chat's tools and forced-call grammar for the request's `tools` and `tool_choice`."""
    tools = [
        Tool(
            type="function",
            function=FunctionDefinition(name=t.name, description=t.description, parameters=t.input_schema),
        )
        for t in request.tools or []
    ]
    choice = request.tool_choice
    try:
        return task_tools_and_constraint(tools, _chat_tool_choice(choice), None)
    except ToolProblem as problem:
        raise RequestProblem(400, str(problem), param=problem.param) from problem


def one_call_at_most(request: MessagesRequest) -> bool:
    """`disable_parallel_tool_use`: a forced call is one call by grammar; with `auto` the model's
    first call is kept and what it writes after it dropped (`tool_calls.ToolCallSplitter.max_calls`)."""
    choice = request.tool_choice
    return isinstance(choice, ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool) and bool(
        choice.disable_parallel_tool_use
    )


def _chat_tool_choice(choice: MessagesToolChoice | None) -> ToolChoice | None:
    match choice:
        case None:
            return None
        case ToolChoiceAuto():
            return "auto"
        case ToolChoiceAny():
            return "required"
        case ToolChoiceNone():
            return "none"
        case ToolChoiceTool(name=name):
            return NamedToolChoice(type="function", function=FunctionName(name=name))


def to_task(request: MessagesRequest, *, max_tokens_limit: int) -> tuple[list[ChatMessage], TaskParams]:
    """Messages and params for `TaskCreated`, after checking the values a model cannot fix."""
    if request.max_tokens > max_tokens_limit:
        raise RequestProblem(
            400,
            f"max_tokens={request.max_tokens} exceeds this server's limit of {max_tokens_limit}",
            param="max_tokens",
        )
    stop = list(request.stop_sequences or [])
    stop_bytes = sum(len(s.encode()) for s in stop)
    if stop_bytes > MAX_STOP_BYTES:
        raise RequestProblem(
            400,
            f"stop_sequences take {stop_bytes} bytes together, over the limit of {MAX_STOP_BYTES}",
            param="stop_sequences",
        )
    if request.messages[-1].role == "assistant":
        last = len(request.messages) - 1
        raise RequestProblem(
            400,
            f"messages[{last}] is the assistant's: Anthropic continues a final assistant turn (a prefilled "
            "response), which shoal does not do; end the conversation with a user turn",
            param=f"messages[{last}]",
        )
    messages = chat_messages(request)
    tools, constraint = tools_and_constraint(request)
    params = TaskParams(
        max_tokens=request.max_tokens,
        temperature=request.temperature if request.temperature is not None else ANTHROPIC_DEFAULT_TEMPERATURE,
        top_p=request.top_p if request.top_p is not None else 1.0,
        top_k=request.top_k or 0,
        stop=stop,
        tools=tools,
        constraint=constraint,
    )
    return messages, params
