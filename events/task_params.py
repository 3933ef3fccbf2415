"""What a client asks of a task's generation (`TaskParams`, carried by `TaskCreated`), apart from the
catalogue so the runner's engine, which sees no events, builds its request from the same struct
(`runner.engine.requests.GenerationRequest` adds the prompt and the task). Pure data; the rules of
`events/catalogue.py` apply (new fields only with defaults)."""

from __future__ import annotations

import msgspec

from events.constraints import Constraint, ToolFunction

# Tokens a task may generate when its request does not say (the API's `max_tokens` default);
# the most a request may ask for is the config's `max_tokens_limit`.
DEFAULT_MAX_TOKENS = 256


class TaskParams(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    # mlx-lm's (and vLLM's) other truncations of the draw, after top_p: a token under min_p times
    # the likeliest one's probability is out, then all but the top_k likeliest; 0 = off
    min_p: float = 0.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    stream_progress: bool = False
    # Log probabilities per generated token, with this many most likely alternatives (0..20);
    # None: none asked, and none computed (they cost a top-k per token on the sampling rank).
    logprobs: int | None = None
    tools: list[ToolFunction] = msgspec.field(default_factory=list)
    constraint: Constraint | None = None
    # OpenAI's logit adjustments, on the sampling rank: each token already generated has its
    # logit lowered by frequency_penalty x its count + presence_penalty; logit_bias adds to the
    # logits of the tokens it names, (token id, bias) in the order given.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: list[tuple[int, float]] = msgspec.field(default_factory=list)
    # Ollama's `keep_alive`: how long the instance that serves this task stays loaded once idle
    # (seconds; 0 = unload once done; negative = never); None: the cluster's model_keep_alive_seconds.
    keep_alive_seconds: float | None = None
    # A thinking model's switch, passed to its chat template as `enable_thinking` (Qwen3's); None:
    # not passed, the template's own default. The API sets it only for a template that reads it.
    enable_thinking: bool | None = None
    # OpenAI's `n`: how many completions (choices) of the one prompt. Each is a row of the
    # instance's batch with its own seed stream (`runner.engine.choices`); the prompt is prefilled
    # once and its KV handed to every row. The API bounds it (`max_choices`).
    n: int = 1
