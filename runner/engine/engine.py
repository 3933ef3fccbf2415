"""The runner engine: one object per rank, loaded once, reused for every task.

Every rank calls the same methods with the same arguments in the same order (the services
deliver tasks from one ordered log). From there the engine keeps the invariant that stops
hangs: every rank issues the same sequence of collectives and sends/recvs, and every branch
that could change it is taken on agreed data (the request, the world size, an all-reduce).
"""

from __future__ import annotations

import functools

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

from events.constraints import Constraint, ToolCallRequired, ToolFunction
from events.runner_settings import RunnerSettings
from runner.engine.calibration import agreed_keys, measure_keys_per_token, proposal, time_probes
from runner.engine.calibration_probe import owned_layers_forward
from runner.engine.collectives import Collectives
from runner.engine.constraints import GrammarCompiler
from runner.engine.decode import DecodeSpec
from runner.engine.kv_budget import budget_bytes, reservation, token_capacity
from runner.engine.pace import StepPace
from runner.engine.plan import (
    effective_step,
    model_keys_per_token,
    prefill_cost,
)
from runner.engine.preparation import Prepared
from runner.engine.protocols import CancelSource, PhaseTracker, RunnerSink
from runner.engine.requests import (
    GenerationOutcome,
    GenerationRequest,
    check_request,
    completion_room,
    truncation_of,
)
from runner.engine.sampling import (
    check_adjustments,
    check_truncation,
    logit_adjustments,
    request_sampler,
)
from runner.engine.shard import LoadedShard, ShardCache
from runner.engine.task_run import TaskRun
from runner.errors import RequestError
from runner.memory import memory_available_bytes
from runner.models.chat import encode_chat
from runner.models.grammar import GrammarError, check_grammar, grammar_for
from runner.models.kv_size import kv_bytes_per_token
from runner.models.shard import model_layers
from runner.models.tool_formats import special_tokens_of, tool_format_of

__all__ = ["Engine", "GenerationOutcome", "GenerationRequest", "encode_chat"]  # the engine's entry point


class Engine:
    """One rank's engine: the loaded shard, the checks every rank applies to a request alike, the
    agreed prefill rate and the KV budget. It runs nothing itself: every request goes through a
    `ContinuousBatch` built on it (`batch.py`; alone: `alone.py`). `settings` are the instance's
    (`InstancePlaced.settings`), the same on every rank."""

    def __init__(
        self,
        group: mx.distributed.Group | None,
        shard: LoadedShard,
        settings: RunnerSettings,
        ranks_on_host: int = 1,
    ) -> None:
        """`ranks_on_host`: the instance's ranks on this rank's machine (they share its memory)."""
        self.shard = shard
        self.settings = settings
        self.ranks_on_host = ranks_on_host
        self.collectives = Collectives(group, shard.peer_wait)
        self.grammars: GrammarCompiler | None = None  # built on the sampling rank at its first grammar
        self._measured_keys: float | None = None  # `calibrate_prefill`'s agreed rate
        if self.collectives.world != shard.placement.world:
            raise ValueError(f"group has {self.collectives.world} ranks, placement {shard.placement.world}")

    @property
    def rank(self) -> int:
        return self.collectives.rank

    @property
    def is_sampling_rank(self) -> bool:
        return self.shard.placement.is_last

    @functools.cached_property
    def vocab_size(self) -> int | None:
        """The rows of the model's logits (None: its config does not say, as no family here does)."""
        size = getattr(getattr(self.shard.model, "args", None), "vocab_size", None)
        return int(size) if isinstance(size, int) else None

    @functools.cached_property
    def special_tokens(self) -> dict[str, int]:
        """The tokenizer's special tokens by text: a forced call's markers among them are written as
        those tokens (`grammar_for`)."""
        return special_tokens_of(self.tokenizer)

    @functools.cached_property
    def priced_keys_per_token(self) -> float | None:
        """The model's exchange rate between a token's matmuls and attended keys, from its shape's flops."""
        return model_keys_per_token(vars(self.shard.model.args))  # pyright: ignore[reportAttributeAccessIssue, reportOptionalMemberAccess]

    @property
    def prefill_keys_per_token(self) -> float | None:
        """The rate `plan.balanced_chunk_sizes` cuts chunks at: the ranks' measured one once
        `calibrate_prefill` ran, else the priced one (alike on every rank either way)."""
        return self.priced_keys_per_token if self._measured_keys is None else self._measured_keys

    def calibrate_prefill(self) -> float | None:
        """Every rank, at the same point, before any batch is built (its budget and pace are priced
        in this rate): time this rank's own layers (`calibration`), then one all-reduce of the
        proposals, whatever each rank measured. Returns the rate every rank uses from now on."""
        if "pace" in self.__dict__:
            raise RuntimeError("calibrate_prefill runs before the pace is learnt: it is priced in this rate")
        priced = self.priced_keys_per_token
        measured: float | None = None
        if priced is not None:
            try:
                step = effective_step(self.settings.prefill_step_size, self.collectives.world)
                forward = owned_layers_forward(self.shard)
                measured = measure_keys_per_token(lambda: time_probes(forward, step), priced)
            except Exception:  # a family whose layers are called otherwise: this rank proposes nothing
                measured = None
            mx.clear_cache()  # the probes' buffers: the KV budget read next counts that memory as free
        total = self.collectives.agree(proposal(measured, priced))
        self._measured_keys = agreed_keys(total, self.collectives.world, priced)
        return self.prefill_keys_per_token

    @functools.cached_property
    def pace(self) -> StepPace:
        """This rank's batch step periods against a full first chunk; only rank 0's is agreed (`pace.py`)."""
        step = effective_step(self.settings.prefill_step_size, self.collectives.world)
        return StepPace(prefill_cost(step, 0, self.prefill_keys_per_token))

    @functools.cached_property
    def kv_capacity(self) -> int:
        """KV positions of this rank's layers its `kv_cache_bytes` holds (0: its share of half the
        memory available at the first call: the first batch built reads it, the warm-up's); a
        batch admits within the least over ranks (`kv_budget.py`)."""
        placement, settings = self.shard.placement, self.settings
        layers = model_layers(self.shard.model)[placement.start : placement.end]
        budget = budget_bytes(settings.kv_cache_bytes, memory_available_bytes(), self.ranks_on_host)
        return token_capacity(budget, kv_bytes_per_token(layers, settings.kv_bits, settings.kv_group_size))

    def kv_reservation(self, request: GenerationRequest) -> int:
        """The KV positions `request` may come to hold: its prompt and completion room (alike on every rank)."""
        prompt_len = len(request.prompt_token_ids)
        return reservation(prompt_len, completion_room(request.max_tokens, prompt_len, self.shard.context_length))

    @property
    def tokenizer(self) -> TokenizerWrapper:
        return self.shard.tokenizer

    def validate(self, request: GenerationRequest) -> None:
        self._checked_grammar(request)

    def prepare(self, request: GenerationRequest) -> Prepared:
        """`validate`'s verdict and, on the sampling rank, the compiled grammar: what admitting
        `request` into a batch takes, prepared off the step loop (`preparation.py`)."""
        try:
            grammar = self._checked_grammar(request)
        except RequestError as exc:
            return Prepared(error=str(exc))
        if grammar is None or not self.is_sampling_rank:
            return Prepared()
        return Prepared(token_mask=self._grammar_compiler().mask(grammar))

    def _checked_grammar(self, request: GenerationRequest) -> str | None:
        """Raise `RequestError` unless every rank can run `request`; its grammar, if constrained."""
        check_request(request, self.shard.context_length)
        check_truncation(truncation_of(request))
        check_adjustments(request.frequency_penalty, request.presence_penalty, request.logit_bias, self.vocab_size)
        return None if request.constraint is None else self._grammar(request.constraint, request.tools)

    def _grammar(self, constraint: Constraint, tools: list[ToolFunction]) -> str:
        """The constraint's grammar, checked on every rank (the same verdict everywhere)."""
        if isinstance(constraint, ToolCallRequired):
            # the API chose the format from its own copy of the template; one from elsewhere (the
            # API could not read the template) must still be the one this model writes
            own = tool_format_of(getattr(self.tokenizer, "chat_template", None), ())
            if own is None or own.forced != constraint.format:
                writes = "no format shoal can force" if own is None or own.forced is None else own.forced
                raise RequestError(
                    f"a forced tool call in the {constraint.format} format, but this model's chat template writes {writes}"
                )
        try:
            grammar = grammar_for(constraint, tools, self.special_tokens)
            check_grammar(grammar)
        except GrammarError as exc:
            raise RequestError(f"cannot constrain the output: {exc}") from exc
        return grammar

    def _grammar_compiler(self) -> GrammarCompiler:
        """Built once; a shell's preparer thread and the step loop racing to build it would each
        build a valid one (the last kept), never a broken one."""
        if self.grammars is None:
            vocab_size = int(self.shard.model.args.vocab_size)  # pyright: ignore[reportAttributeAccessIssue, reportOptionalMemberAccess]
            self.grammars = GrammarCompiler(self.tokenizer._tokenizer, self.tokenizer.eos_token_id, vocab_size)
        return self.grammars

    def decode_spec(self, request: GenerationRequest, prefill_iterations: int, prepared: Prepared) -> DecodeSpec:
        """How `request` decodes on this rank: its sampler (its own PRNG key when seeded), stop rules
        and, on the sampling rank, its grammar mask (`prepared`'s)."""
        return DecodeSpec(
            prompt_len=len(request.prompt_token_ids),
            max_tokens=completion_room(request.max_tokens, len(request.prompt_token_ids), self.shard.context_length),
            stop=list(request.stop),
            sampler=request_sampler(request.temperature, truncation_of(request), request.seed),
            eos_ids=frozenset(int(i) for i in self.tokenizer.eos_token_ids),
            prefill_iterations=prefill_iterations,
            top_logprobs=request.logprobs,
            token_mask=prepared.token_mask,
            adjustments=(
                logit_adjustments(request.frequency_penalty, request.presence_penalty, request.logit_bias)
                if self.is_sampling_rank
                else None
            ),
        )

    def task_run(self, task_id: str, cancel: CancelSource, sink: RunnerSink, phases: PhaseTracker) -> TaskRun:
        shard, settings = self.shard, self.settings
        return TaskRun(
            task_id=task_id,
            model=self.shard.model,
            placement=self.shard.placement,
            caches=ShardCache(shard.model, shard.placement, settings.kv_bits, settings.kv_group_size),
            outbox=self.shard.outbox,
            receive_gate=self.shard.receive_gate,
            collectives=self.collectives,
            cancel=cancel,
            sink=sink,
            phases=phases,
        )
