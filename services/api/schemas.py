"""Request bodies of the HTTP API, decoded strictly with msgspec at the edge.

What a value may be is declared on the struct (`Meta` bounds), so `/openapi.json` states it and a
decoding error names the field (`messages[0].role`), which is what the 400 says. Limits from the
config (max_tokens, prompt size) and the model (context, chat template) are checked after
decoding, in `to_task` and the chat route. OpenAI parameters shoal does not implement are refused
by name (`UNSUPPORTED_PARAMS`) rather than ignored: a client must never get silently less than
it asked for.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Annotated, Literal, TypeVar

import msgspec

from events.catalogue import ChatMessage
from events.ids import KeyId
from events.task_params import DEFAULT_MAX_TOKENS, TaskParams
from events.vocabulary import BIAS_BOUND, MAX_BIASED_TOKENS, PENALTY_BOUND
from services.api.fair_lane import FairLane
from services.api.reasoning import ReasoningEffort, thinking_switch_of
from services.api.tools import (
    RequestToolCall,
    ResponseFormat,
    Tool,
    ToolChoice,
    ToolProblem,
    task_tool_calls,
    task_tools_and_constraint,
)

MAX_STOP_STRINGS = 4  # OpenAI's own bound
MAX_STOP_BYTES = 1024  # all stop strings together: the sampling rank matches them on every token
SEED_MAX = 2**63 - 1  # OpenAI's seed is an int64; the runner's RNG (mlx.random.seed) refuses negative ones

# Sampling extensions other servers take (mlx-lm's server, vLLM, llama.cpp) that shoal does not
# implement, on both routes: a client that sends them expects them honoured. (`top_k` and `min_p`
# are implemented: `SamplingRequest`.)
UNSUPPORTED_SAMPLING_EXTENSIONS: Mapping[str, tuple[object, ...]] = {
    "repetition_penalty": (1.0,),
    "repetition_context_size": (),
    "min_tokens": (0,),
    "ignore_eos": (False,),
    "typical_p": (1.0,),
    "xtc_probability": (0.0,),
}

# OpenAI chat parameters shoal does not implement, each with the values that ask for nothing more
# than OpenAI does when it is left out (so clients that send defaults still work); JSON null
# always means "left out". Any other value is a 400 naming the parameter. An issue that implements
# one moves it from here into `ChatCompletionRequest`.
UNSUPPORTED_PARAMS: Mapping[str, tuple[object, ...]] = {
    "functions": ([],),
    "function_call": ("none",),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
    "store": (False,),
    **UNSUPPORTED_SAMPLING_EXTENSIONS,
}

# The same for `/v1/completions`: its own legacy parameters, and the chat ones it shares.
UNSUPPORTED_COMPLETION_PARAMS: Mapping[str, tuple[object, ...]] = {
    "best_of": (1,),
    "suffix": ("",),
    **UNSUPPORTED_SAMPLING_EXTENSIONS,
}

MAX_CHOICES = 128  # OpenAI's bound on `n`; the server's own is `max_choices` (`task_stream.admit`)
MAX_TOP_K = 1 << 31  # past any vocabulary: a top_k of the vocabulary or more keeps every token
MAX_TOP_LOGPROBS = 20  # chat's bound in OpenAI's API
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' bound

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-PENALTY_BOUND, le=PENALTY_BOUND)]
Bias = Annotated[float, msgspec.Meta(ge=-BIAS_BOUND, le=BIAS_BOUND)]
BiasedToken = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}$")]  # a token id, as JSON keys are strings
StopString = Annotated[str, msgspec.Meta(min_length=1)]


class TextPart(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["text"]
    text: str


class RequestMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None  # None only beside an assistant's tool_calls
    name: str | None = None
    tool_calls: list[RequestToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool result: the call it answers

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    include_usage: bool = False
    include_progress: bool = False


KeepAliveDuration = Annotated[str, msgspec.Meta(max_length=32, pattern=r"^[+-]?[0-9][0-9.hms]*$")]


class SamplingRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What chat and text completion requests share: the model, sampling, stops and streaming."""

    model: str
    max_tokens: PositiveInt | None = None
    # OpenAI's nullable parameters take null as "left out" (clients that serialize every field send it)
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None  # None: 0, greedy
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None  # None: 1
    # mlx-lm's server's and vLLM's extensions: None or 0 is off (`events.catalogue.TaskParams`)
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_K)] | None = None
    seed: Annotated[int, msgspec.Meta(ge=0, le=SEED_MAX)] | None = None
    stop: StopString | Annotated[list[StopString], msgspec.Meta(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: Annotated[dict[BiasedToken, Bias], msgspec.Meta(max_length=MAX_BIASED_TOKENS)] | None = None
    # Ollama's: how long the model stays loaded once idle, seconds or a duration ("5m", "1h30m",
    # "-1"); 0 unloads it once this request is done, a negative value keeps it loaded.
    keep_alive: float | KeepAliveDuration | None = None
    # OpenAI's: completions of the one prompt, each a row of the batch sharing its prefill (None: 1)
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)] | None = None

    @property
    def wants_progress(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_progress

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def wants_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(SamplingRequest, frozen=True, kw_only=True):
    messages: Annotated[list[RequestMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    shoal_progress: bool = False
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None  # none given: "auto" with tools, "none" without
    parallel_tool_calls: bool | None = None  # false: at most one call (`tool_calls.ToolCallSplitter.max_calls`)
    response_format: ResponseFormat | None = None
    reasoning_effort: ReasoningEffort | None = None  # a thinking switch: see `thinking_switch_of`

    @property
    def wants_progress(self) -> bool:
        return self.shoal_progress or super().wants_progress


TokenId = Annotated[int, msgspec.Meta(ge=0)]


class CompletionRequest(SamplingRequest, frozen=True, kw_only=True):
    """`/v1/completions`: one prompt, as text or token ids. OpenAI's list of several prompts decodes
    (so the 400 can say why) and is refused in `single_prompt`."""

    prompt: str | Annotated[list[TokenId | str | list[TokenId]], msgspec.Meta(min_length=1)]
    echo: bool | None = None
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text, or token ids (a list of ints, or a list holding one prompt)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        if all(isinstance(item, int) for item in prompt):
            return [item for item in prompt if isinstance(item, int)]
        if len(prompt) == 1 and not isinstance(prompt[0], int):
            return prompt[0]
        raise RequestProblem(
            400,
            "shoal takes one prompt per request: send a string or a list of token ids, one request per prompt",
            param="prompt",
        )


class RequestProblem(Exception):
    """A request the API refuses: HTTP status plus a message saying what to fix."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str = "invalid_request",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers  # e.g. a 429's Retry-After


R = TypeVar("R")

_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])


def decode_chat_request(body: bytes) -> ChatCompletionRequest:
    return _decode(body, _decoder, UNSUPPORTED_PARAMS)


def decode_completion_request(body: bytes) -> CompletionRequest:
    return _decode(body, _completion_decoder, UNSUPPORTED_COMPLETION_PARAMS)


def decode_body(body: bytes, decoder: msgspec.json.Decoder[R], unsupported: Mapping[str, tuple[object, ...]]) -> R:
    """`body` decoded by `decoder`, with the parameters in `unsupported` refused by name (other routes' bodies)."""
    return _decode(body, decoder, unsupported)


def _decode(body: bytes, decoder: msgspec.json.Decoder[R], unsupported: Mapping[str, tuple[object, ...]]) -> R:
    try:
        request = decoder.decode(body)
        refuse_unsupported(_fields_decoder.decode(body), unsupported)
    except msgspec.ValidationError as exc:
        param = field_of(exc)
        raise RequestProblem(400, f"invalid request body: {exc}{_hint_for(param)}", param=param) from exc
    except msgspec.DecodeError as exc:
        raise RequestProblem(400, f"request body is not valid JSON: {_lone_surrogate(body) or exc}") from exc
    except RecursionError as exc:  # msgspec's bound on nesting, whatever field it is in
        raise RequestProblem(400, f"request body is nested too deeply: {exc}") from exc
    return request


_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def _lone_surrogate(body: bytes) -> str | None:
    """What to fix when a `\\uXXXX` escape is half of a UTF-16 surrogate pair: valid JSON syntax,
    but no character (msgspec reports it as truncated input). A client that cuts a string by
    UTF-16 units, as JavaScript's `slice` does, splits an emoji this way."""
    # left to right, so an escaped backslash is one escape; each \uXXXX as (start, end, code, its hex)
    units = [(m.start(), m.end(), int(m[1], 16), m[1].decode()) for m in _ESCAPE.finditer(body) if m[1]]
    index = 0
    while index < len(units):
        start, end, code, written = units[index]
        following = units[index + 1] if index + 1 < len(units) else None
        if (
            0xD800 <= code <= 0xDBFF
            and following is not None
            and following[0] == end
            and 0xDC00 <= following[2] <= 0xDFFF
        ):
            index += 2  # a whole pair
            continue
        if 0xD800 <= code <= 0xDFFF:
            return (
                f"the escape \\u{written} at byte {start} is half of a UTF-16 surrogate pair "
                "(was the text cut inside a character?); send whole characters, or \\ufffd in its place"
            )
        index += 1
    return None


# What a refused field most likely means, where msgspec's own words leave the fix unsaid.
_CONTENT_PART_TYPE = re.compile(r"^messages\[\d+\]\.content\[\d+\]\.type$")
TEXT_ONLY_HINT = (
    '; shoal serves text models: every content part is {"type": "text", "text": "..."} '
    "(image, audio and file parts are not supported)"
)


LOGIT_BIAS_HINT = '; logit_bias maps token ids, as decimal strings, to a bias from -100 to 100: {"1234": -100}'


def _hint_for(param: str | None) -> str:
    if param is not None and param.startswith("logit_bias"):
        return LOGIT_BIAS_HINT
    return TEXT_ONLY_HINT if param is not None and _CONTENT_PART_TYPE.match(param) else ""


def field_of(exc: msgspec.ValidationError) -> str | None:
    """`messages[0].role` from msgspec's "... - at `$.messages[0].role`" (None at the top level); a
    mapping's key is named by its mapping (`key` in `$.logit_bias`)."""
    _, at, path = str(exc).rpartition(" - at ")
    _, _, path = path.rpartition(" in ")
    return path.strip("`").removeprefix("$.") if at else None


def refuse_unsupported(
    fields: dict[str, msgspec.Raw],
    unsupported: Mapping[str, tuple[object, ...]],
    why: Mapping[str, str] | None = None,
) -> None:
    """A 400 naming the first field of `unsupported` the body sets to anything but one of its
    harmless values (`why`: what to say after, per field)."""
    for name, harmless in unsupported.items():
        if name not in fields:
            continue
        value = msgspec.json.decode(fields[name])
        if value is None or any(type(value) is type(ok) and value == ok for ok in harmless):
            continue
        allowed = " or ".join(msgspec.json.encode(ok).decode() for ok in harmless)
        raise RequestProblem(
            400,
            f"shoal does not implement `{name}`: leave it out"
            + (f" (or send {allowed})" if allowed else "")
            + (why or {}).get(name, ""),
            param=name,
            code="unsupported_parameter",
        )


async def to_task_off_loop(
    request: ChatCompletionRequest, *, max_tokens_limit: int, lane: FairLane, key: KeyId
) -> tuple[list[ChatMessage], TaskParams]:
    """`to_task`, on a thread of `lane` (`PromptLanes.grammars`, in `key`'s turn) when the request
    has tools or a response format: checking a grammar built from a large schema takes llguidance up
    to a second, which on the event loop would hold every other client's stream for as long."""
    if not request.tools and request.response_format is None:
        return to_task(request, max_tokens_limit=max_tokens_limit)
    return await lane.run_sync(key, functools.partial(to_task, request, max_tokens_limit=max_tokens_limit))


def to_task(request: ChatCompletionRequest, *, max_tokens_limit: int) -> tuple[list[ChatMessage], TaskParams]:
    """Messages and params for `TaskCreated`, after checking the values a model cannot fix."""
    if request.top_logprobs is not None and not request.logprobs:
        raise RequestProblem(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    asked = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    params = _task_params(request, asked, max_tokens_limit=max_tokens_limit, logprobs=logprobs)
    for index, message in enumerate(request.messages):
        if message.content is None and not (message.role == "assistant" and message.tool_calls):
            raise RequestProblem(
                400,
                f"messages[{index}] ({message.role}) has no content: give it a string or text parts "
                "(only an assistant message that calls tools may leave its content out)",
                param=f"messages[{index}].content",
            )
    try:
        messages = [_task_message(m, f"messages[{i}].tool_calls") for i, m in enumerate(request.messages)]
        tools, constraint = task_tools_and_constraint(request.tools or [], request.tool_choice, request.response_format)
    except ToolProblem as problem:
        raise RequestProblem(400, str(problem), param=problem.param) from problem
    thinking = thinking_switch_of(request.reasoning_effort)
    if constraint is not None and request.choices > 1:
        raise RequestProblem(
            400,
            f"n={request.choices} with a grammar (response_format json_schema or json_object, a required or named "
            "tool_choice) is not supported: leave n out, or send one request per completion",
            param="n",
            code="unsupported_parameter",
        )
    return messages, msgspec.structs.replace(params, tools=tools, constraint=constraint, enable_thinking=thinking)


def _task_message(message: RequestMessage, where: str) -> ChatMessage:
    return ChatMessage(
        role=message.role,
        content=message.text(),
        tool_calls=task_tool_calls(message.tool_calls or [], where),
        tool_call_id=message.tool_call_id,
    )


def completion_params(request: CompletionRequest, *, max_tokens_limit: int) -> TaskParams:
    if request.echo and request.logprobs is not None:
        raise RequestProblem(
            400,
            "shoal does not compute the prompt's logprobs: send echo or logprobs, not both",
            param="echo",
            code="unsupported_parameter",
        )
    return _task_params(request, request.max_tokens, max_tokens_limit=max_tokens_limit, logprobs=request.logprobs)


def _task_params(
    request: SamplingRequest, asked_max_tokens: int | None, *, max_tokens_limit: int, logprobs: int | None
) -> TaskParams:
    """`TaskParams` after the checks both routes share.

    A request that does not say `max_tokens` gets `DEFAULT_MAX_TOKENS`, or the server's limit when
    that is lower: the limit bounds what a client asks for, so it cannot refuse a request that asked
    for nothing."""
    max_tokens = asked_max_tokens if asked_max_tokens is not None else min(DEFAULT_MAX_TOKENS, max_tokens_limit)
    if max_tokens > max_tokens_limit:
        raise RequestProblem(
            400, f"max_tokens={max_tokens} exceeds this server's limit of {max_tokens_limit}", param="max_tokens"
        )
    stop = request.stop_strings
    stop_bytes = sum(len(s.encode()) for s in stop)
    if stop_bytes > MAX_STOP_BYTES:
        raise RequestProblem(
            400, f"stop strings take {stop_bytes} bytes together, over the limit of {MAX_STOP_BYTES}", param="stop"
        )
    return TaskParams(
        max_tokens=max_tokens,
        temperature=request.temperature if request.temperature is not None else 0.0,
        top_p=request.top_p if request.top_p is not None else 1.0,
        min_p=request.min_p or 0.0,
        top_k=request.top_k or 0,
        seed=request.seed,
        stop=stop,
        stream_progress=request.wants_progress,
        logprobs=logprobs,
        frequency_penalty=request.frequency_penalty or 0.0,
        presence_penalty=request.presence_penalty or 0.0,
        # (token id, bias): the key pattern made each key a token id; the tokenizer checks the vocabulary (`prompts`)
        logit_bias=[(int(token), bias) for token, bias in (request.logit_bias or {}).items()],
        keep_alive_seconds=keep_alive_seconds(request.keep_alive),
        n=request.choices,
    )


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Ollama's `keep_alive` in seconds: a number is seconds; a string is Go's duration ("5m",
    "1h30m", "-1s") or a bare number."""
    if value is None or isinstance(value, float | int):
        return None if value is None else float(value)
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise RequestProblem(
            400, f"keep_alive {value!r} is not a duration: give seconds or e.g. '5m', '1h30m', '-1'", param="keep_alive"
        )
    return sign * sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)
