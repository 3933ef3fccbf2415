"""The request body of `POST /v1/responses` (OpenAI's Responses API), decoded strictly at the edge,
and its translation into the chat request that chat completions serve (`to_chat_request`): a
Responses request becomes the same `TaskCreated` as the chat request it amounts to, checked by the
same `to_task` (tools, grammar, limits), so there is one serving path.

shoal keeps no server-side conversation state: a client sends the whole conversation every time
(the Responses API's `store: false` way, which Codex CLI uses). So `previous_response_id` and
`conversation` are refused with a 400 that says so, `store: true` is refused (nothing could be
retrieved later), and input items that point at stored state (`item_reference`) are refused.
Reasoning items a client replays are accepted and left out of the prompt: chat templates drop a
past turn's reasoning themselves (Qwen3's does), and shoal has nothing else to do with them.

What Codex CLI sends besides is taken where it can take effect: `parallel_tool_calls: false` holds
the answer to one call, `reasoning.summary` is accepted (no summary is written: the reasoning item
carries the reasoning itself), and `include` entries are accepted or refused as `IncludeEntry` says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from services.api.reasoning import ReasoningEffort
from services.api.schemas import (
    UNSUPPORTED_SAMPLING_EXTENSIONS,
    ChatCompletionRequest,
    RequestMessage,
    RequestProblem,
    TextPart,
    decode_body,
)
from services.api.tools import (
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    NamedToolChoice,
    RequestToolCall,
    ResponseFormat,
    TextFormat,
    Tool,
    ToolChoice,
)

T = TypeVar("T")

NO_STATE = (
    "shoal keeps no server-side conversation state (every request is `store: false`): "
    "send the whole conversation in `input` instead"
)

# Responses parameters shoal does not implement, with the values that ask for nothing more than
# leaving them out (JSON null always means left out); anything else is a 400 naming the parameter.
UNSUPPORTED_RESPONSES_PARAMS: Mapping[str, tuple[object, ...]] = {
    "background": (False,),
    "max_tool_calls": (),
    "prompt": (),
    "service_tier": ("auto", "default"),
    "top_logprobs": (0,),
    "truncation": ("disabled",),
    **UNSUPPORTED_SAMPLING_EXTENSIONS,
}
# Refused whatever their value (null aside), because they need responses kept on the server.
STATEFUL_PARAMS = ("previous_response_id", "conversation")

FunctionName64 = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]


MessageRole = Literal["user", "assistant", "system", "developer"]


class InputPart(msgspec.Struct, frozen=True, kw_only=True):
    """A message's text part: `input_text` from a client, `output_text` in an assistant message it
    replays (both carry `text`). Image, file and audio parts are refused (`input_image`, ...)."""

    type: Literal["input_text", "output_text"]
    text: str


class InputItem(msgspec.Struct, frozen=True, kw_only=True):
    """One item of `input`, by `type` (a message when left out, as OpenAI's "easy" input message).

    One struct rather than a tagged union: a message may leave `type` out, which msgspec's tagged
    unions cannot take. Which fields each type needs is checked in `to_chat_request`, naming the
    field (`input[2].call_id`)."""

    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    # message
    role: MessageRole | None = None
    content: str | list[InputPart] | None = None
    # function_call (the model's, replayed) and function_call_output (its result)
    call_id: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    name: FunctionName64 | None = None
    arguments: str | None = None  # JSON text
    output: str | list[InputPart] | None = None
    # what OpenAI's own output items also carry, taken and not needed
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    summary: list[dict[str, Any]] | None = None  # reasoning: left out of the prompt
    encrypted_content: str | None = None


class FunctionTool(msgspec.Struct, frozen=True, kw_only=True):
    """A function the model may call (Responses' flat form of chat's `tools[].function`). Built-in
    tools (web_search, file_search, computer_use, mcp, ...) are refused: shoal runs no tools."""

    type: Literal["function"]
    name: FunctionName64
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["function"]
    name: str


ResponsesToolChoice = Literal["none", "auto", "required"] | NamedFunction


class PlainText(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="text"):
    pass


class JsonObjectText(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="json_object"):
    pass


class JsonSchemaText(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="json_schema"):
    """Responses' flat form of chat's `response_format.json_schema`."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


TextFormatSpec = PlainText | JsonObjectText | JsonSchemaText


class TextConfig(msgspec.Struct, frozen=True, kw_only=True):
    format: TextFormatSpec | None = None
    verbosity: Literal["medium"] | None = None  # the only one a model without the setting has


class ReasoningConfig(msgspec.Struct, frozen=True, kw_only=True):
    effort: ReasoningEffort | None = None  # as chat's reasoning_effort: a thinking model's switch
    # shoal writes no summaries (it has no model to write them with): the reasoning item carries
    # the reasoning itself (`reasoning_text`) and an empty `summary`, whichever is asked for
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # its older name


# What `include` may ask for. "reasoning.encrypted_content" asks for reasoning a stateless server
# can be given back in the next request: shoal needs none back (chat templates drop a past turn's
# reasoning, and replayed reasoning items are accepted and left out), so there is nothing to
# encrypt and the item goes without it. The others name outputs of built-in tools and images, which
# shoal never produces (it refuses such tools and inputs), so there is nothing to add.
# "message.output_text.logprobs" is refused (`INCLUDE_REFUSED`): ignoring it would silently drop
# what the client asked for.
IncludeEntry = Literal[
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    "web_search_call.action.sources",
    "web_search_call.results",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
]
INCLUDE_REFUSED: Mapping[str, str] = {
    "message.output_text.logprobs": "shoal's Responses route returns no logprobs: ask /v1/chat/completions "
    "with logprobs=true for them, or leave this entry out",
}


class ResponsesRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    input: str | Annotated[list[InputItem], msgspec.Meta(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None  # None: 0, greedy
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    stream: bool | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ResponsesToolChoice | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: Literal[False] | None = None  # nothing is kept: `true` is refused (see the module's doc)
    parallel_tool_calls: bool | None = None  # false: at most one call (the splitter keeps the first)
    include: list[IncludeEntry] | None = None  # see `IncludeEntry`
    metadata: Annotated[dict[str, str], msgspec.Meta(max_length=16)] | None = None  # echoed back
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # shoal's prefix cache needs no key: any prompt's prefix is reused
    previous_response_id: str | None = None  # refused unless null: `STATEFUL_PARAMS`
    conversation: str | dict[str, Any] | None = None  # the same


_decoder = msgspec.json.Decoder(ResponsesRequest)

# What a refused field most likely means, where msgspec's own words leave the fix unsaid.
_HINTS = (
    (
        ".type",
        "tools[",
        "; shoal runs no built-in tools (web_search, file_search, computer_use, code_interpreter, mcp, ...): "
        'only {"type": "function", "name": ..., "parameters": {...}} tools, which the client runs',
    ),
    (
        ".type",
        "input[",
        "; input items are messages (content as a string or input_text parts), function_call and "
        "function_call_output; shoal serves text models (no images, files or audio) and keeps no items to reference",
    ),
    ("store", "store", f"; {NO_STATE}"),
)


def decode_responses_request(body: bytes) -> ResponsesRequest:
    try:
        request = decode_body(body, _decoder, UNSUPPORTED_RESPONSES_PARAMS)
    except RequestProblem as problem:
        raise _with_hint(problem) from problem
    for index, entry in enumerate(request.include or []):
        if entry in INCLUDE_REFUSED:
            raise RequestProblem(
                400,
                f"include entry {entry!r} is not supported: {INCLUDE_REFUSED[entry]}",
                param=f"include[{index}]",
                code="unsupported_parameter",
            )
    for name in STATEFUL_PARAMS:
        if getattr(request, name) is not None:
            raise RequestProblem(
                400, f"`{name}` is not supported: {NO_STATE}", param=name, code="unsupported_parameter"
            )
    return request


def _with_hint(problem: RequestProblem) -> RequestProblem:
    param = problem.param or ""
    for ending, beginning, hint in _HINTS:
        if param.startswith(beginning) and param.endswith(ending):
            return RequestProblem(problem.status, problem.message + hint, param=problem.param, code=problem.code)
    return problem


def to_chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request a Responses request amounts to: `instructions` as the first (system)
    message, the input items as chat messages, the flat tools and text format as chat's."""
    messages = [RequestMessage(role="system", content=request.instructions)] if request.instructions else []
    if isinstance(request.input, str):
        messages.append(RequestMessage(role="user", content=request.input))
    else:
        messages.extend(_chat_messages(request.input))
    if not messages:
        raise RequestProblem(400, "input has nothing for the model: give it a message", param="input")
    return ChatCompletionRequest(
        model=request.model,
        messages=messages,
        max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        stream=request.stream,
        user=request.user,
        tools=[_chat_tool(t) for t in request.tools] if request.tools else None,
        tool_choice=_chat_tool_choice(request.tool_choice),
        parallel_tool_calls=request.parallel_tool_calls,
        response_format=_response_format(request.text),
        reasoning_effort=None if request.reasoning is None else request.reasoning.effort,
    )


def _chat_messages(items: Sequence[InputItem]) -> list[RequestMessage]:
    """Messages in order; consecutive function calls join the assistant turn before them (as chat
    templates render one assistant message with its text and its calls)."""
    messages: list[RequestMessage] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        match item.type:
            case "message":
                messages.append(_message(item, where))
            case "function_call":
                call = _replayed_call(item, where)
                last = messages[-1] if messages else None
                if last is not None and last.role == "assistant":
                    joined = msgspec.structs.replace(last, tool_calls=[*(last.tool_calls or []), call])
                    messages[-1] = joined
                else:
                    messages.append(RequestMessage(role="assistant", content=None, tool_calls=[call]))
            case "function_call_output":
                call_id = _required(item.call_id, f"{where}.call_id", "the id of the function_call it answers")
                output = _required(item.output, f"{where}.output", "the function's result")
                messages.append(RequestMessage(role="tool", content=_text(output), tool_call_id=call_id))
            case "reasoning":
                pass  # a past turn's reasoning: chat templates leave it out (see the module's doc)
    return messages


def _message(item: InputItem, where: str) -> RequestMessage:
    role: MessageRole = _required(item.role, f"{where}.role", "user, assistant, system or developer")
    content = _required(item.content, f"{where}.content", "a string or input_text parts")
    return RequestMessage(role=role, content=_text(content))


def _replayed_call(item: InputItem, where: str) -> RequestToolCall:
    call_id = _required(item.call_id, f"{where}.call_id", "the call's id, which its function_call_output names")
    name = _required(item.name, f"{where}.name", "the function called")
    arguments = _required(item.arguments, f"{where}.arguments", "the call's arguments as JSON text")
    return RequestToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))


def _required(value: T | None, param: str, what: str) -> T:
    if value is None:
        raise RequestProblem(400, f"{param} is missing: give it {what}", param=param)
    return value


def _text(content: str | list[InputPart]) -> str | list[TextPart]:
    if isinstance(content, str):
        return content
    return [TextPart(type="text", text=part.text) for part in content]


def _chat_tool(tool: FunctionTool) -> Tool:
    definition = FunctionDefinition(
        name=tool.name, description=tool.description or "", parameters=tool.parameters, strict=tool.strict
    )
    return Tool(type="function", function=definition)


def _chat_tool_choice(choice: ResponsesToolChoice | None) -> ToolChoice | None:
    if isinstance(choice, NamedFunction):
        return NamedToolChoice(type="function", function=FunctionName(name=choice.name))
    return choice


def _response_format(text: TextConfig | None) -> ResponseFormat | None:
    match None if text is None else text.format:
        case None:
            return None
        case PlainText():
            return TextFormat()
        case JsonObjectText():
            return JsonObjectFormat()
        case JsonSchemaText() as spec:
            json_schema = JsonSchemaSpec(
                name=spec.name, description=spec.description, schema=spec.schema, strict=spec.strict
            )
            return JsonSchemaFormat(json_schema=json_schema)
