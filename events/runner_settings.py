"""What every rank of an instance runs with: one typed struct, carried by `InstancePlaced`.

Each runner setting is declared here once: its name, its type with its constraint and meaning
(the aliases below) and its default (on `RunnerSettings`). `services/config.py` offers the
same names as config keys with these types and defaults; the master places every instance with
the `RunnerSettings` of its config, and each rank reads them from the log. One channel, written
once per instance, so the ranks of an instance cannot disagree, and they must not: they cut the
prompt into the same chunks and agree on each step's batch together. `shoal generate` (runner/local) takes the same
defaults from here.

It lives in events/ because `InstancePlaced` embeds it and both services/ and runner/ import
events/ (runner/ does not import services/, and events/ imports neither).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

MAX_SECONDS = 1e9  # keeps a duration finite (a msgspec bound must be): 31 years is "never"

# The constraint of every duration setting: greater than 0 and finite.
POSITIVE_SECONDS = msgspec.Meta(gt=0.0, le=MAX_SECONDS)

PrefillStepSize = Annotated[
    int, msgspec.Meta(ge=1, description="prompt tokens per prefill step; a rank's chunk is it / min(4, ranks)")
]
KvBits = Annotated[
    Literal[2, 3, 4, 6, 8] | None, msgspec.Meta(description="quantize the KV cache to this many bits; none = off")
]
KvGroupSize = Annotated[Literal[32, 64, 128], msgspec.Meta(description="group size of the KV-cache quantization")]
MaxBatch = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        le=256,
        description="sequences an instance decodes at once (continuous batching); 1 = one task at a time",
    ),
]
BatchChunkEventsPerRound = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        description="chunk events a full batch publishes per round (a token for each of its streams), about: "
        "with R streams decoding each one's tokens go out every R/N tokens (its first text at once); max_batch or "
        "more: every token at once",
    ),
]
StreamChunkMinIntervalSeconds = Annotated[
    float,
    msgspec.Meta(
        ge=0.0,
        le=1.0,
        extra={"allowed": "a number of seconds from 0 to 1"},
        description="least time between two chunk events of one stream: tokens decoded faster wait and go out "
        "together with the next (its first text at once, the rest at its end); 0: as each is decoded. "
        "Applies to batching instances (max_batch > 1)",
    ),
]
PrefixCacheBytes = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        description="bytes of KV each rank keeps from finished requests, reused by the next request that "
        "starts with the same tokens (least recently used goes first); 0 = off",
    ),
]
KvCacheBytes = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        description="bytes of KV cache the running batch may reserve on each rank (its own layers): a request "
        "is admitted once its prompt plus max_tokens fit beside the running ones, waiting in the queue until "
        "then, and fails with an error if it cannot fit alone; 0 = half the memory available once the shard is "
        "loaded, split between the instance's ranks on that machine",
    ),
]
HeartbeatIntervalSeconds = Annotated[
    float, POSITIVE_SECONDS, msgspec.Meta(description="seconds between two heartbeats of a node, and of a rank")
]
StallStackSeconds = Annotated[
    float, POSITIVE_SECONDS, msgspec.Meta(description="a rank's heartbeat carries its stack once its phase is this old")
]
ModelDownload = Annotated[
    bool,
    msgspec.Meta(
        extra={"allowed": "true or false"},
        description="a rank may download a Hub model missing from its node's cache (HF_HUB_OFFLINE still wins)",
    ),
]

PublishBacklogEvents = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        description="events a rank keeps while the log is unreachable; past it, the task that would "
        "lose one fails (never completes with text missing)",
    ),
]


class RunnerSettings(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything a rank needs beyond its identity (nats url, instance, rank, node)."""

    prefill_step_size: PrefillStepSize = 256
    kv_bits: KvBits = None
    kv_group_size: KvGroupSize = 64
    # 32, as mlx-lm's BatchGenerator and `mlx_lm.server --decode-concurrency`: at 8, 16 clients of the
    # tiny model got 0.78x mlx_lm.server's aggregate, at 32 1.02x (`shoal bench serve`, one run).
    max_batch: MaxBatch = 32
    # 4: on a 2-core machine every chunk event (log, API, client stream) costs about what it costs
    # whatever it carries, out of the batch's own forward; one per row per step gave 16 clients of the
    # tiny model 3.8x a single stream's rate, 4 per round 5.4x (tokens then arrive in fours at 16 rows).
    batch_chunk_events_per_round: BatchChunkEventsPerRound = 4
    # 25 ms (40 updates a second, smoother than a reader can follow): a stream faster than that (a
    # small model, a fast machine) sends its tokens in twos or threes; one slower than 40 tokens/s
    # sends every token. Each event costs ~2 ms of CPU across the runner's bridge, NATS, the API and
    # the client on a 2-core machine, taken from the forward (tiny model, 1 worker's decode rate vs
    # bare mlx-lm, interleaved in one run of 30 rounds: 0.87 at 8 ms, 1.01 at 25 ms; another run 0.85
    # at 8 ms, 0.94 at 20 ms, 0.97 at 33 ms).
    stream_chunk_min_interval_seconds: StreamChunkMinIntervalSeconds = 0.025
    # 1 GiB per rank: ~8 conversations of 2,000 tokens of a 7B model (128 KiB of KV per token, fp16)
    # if one rank held every layer; more on a split model, thousands on a small one.
    prefix_cache_bytes: PrefixCacheBytes = 1 << 30
    # 0: half of what is available once the weights are in, the other half left to activations, the
    # prefix cache and the rest of the machine; a rank killed for memory would fail every task it runs.
    kv_cache_bytes: KvCacheBytes = 0
    heartbeat_interval_seconds: HeartbeatIntervalSeconds = 1.0
    stall_stack_seconds: StallStackSeconds = 5.0
    model_download: ModelDownload = True
    # ~20 minutes of one task's chunks (8 tokens each at 100 tokens/s); a few tens of MB at most.
    publish_backlog_events: PublishBacklogEvents = 10_000

    @property
    def batch_rows(self) -> int:
        """How many sequences the instance decodes together: every instance serves through its
        continuous batch, quantized KV or not (1: a batch of one, one task at a time)."""
        return self.max_batch
