"""The words shared by the runner, the events, the master and the operator tools, defined once.

Each is a `Literal`, so basedpyright rejects a misspelt value at every hop and msgspec rejects one
on the wire. The sets derived from them come from `get_args`: the list of values exists only in
the `Literal`. Pure: nothing here imports more than `typing`.

Changing a value is a wire change: events carry these words, and old logs must still decode.
"""

from __future__ import annotations

from typing import Literal, get_args

# --- where a runner's main thread is (`PhaseTracker.enter`, carried by `RunnerHeartbeat`) ------

ComputePhase = Literal["prefill", "decode"]  # running the model for a task
# In old logs only: a lone task's start vote (one all-reduce) of the engine path that served a task
# outside the batch; a task's start is now agreed by the batch step that admits it.
RetiredPhase = Literal["agree_start"]
Phase = Literal[
    "idle",  # between tasks (also before the first one)
    "loading",  # joining the group and loading its shard
    "warming_up",  # a tiny task through every path, before reporting ready
    "agree_cancel",  # all ranks vote on stopping it (one all-reduce)
    ComputePhase,
    RetiredPhase,
]
COMPUTE_PHASES: frozenset[Phase] = frozenset(get_args(ComputePhase))
# On a task and not (yet) asked to stop: what a rank that ignores a cancel is still in.
WORKING_PHASES: frozenset[Phase] = COMPUTE_PHASES | frozenset[Phase]({"agree_start"})
# Voting to stop, or done: what a rank that acted on a cancel is in.
STOPPING_PHASES: frozenset[Phase] = frozenset({"agree_cancel", "idle"})

# --- a runner's lifecycle (`RunnerStatusChanged`) ------------------------------------------------

ServingStatus = Literal["ready", "running"]  # warmed up: a running rank is also ready for the next task
DownStatus = Literal["failed", "stopped"]
RunnerStatus = Literal["loading", "warming_up", ServingStatus, DownStatus]
SERVING_STATUSES: frozenset[RunnerStatus] = frozenset(get_args(ServingStatus))
DOWN_STATUSES: frozenset[RunnerStatus] = frozenset(get_args(DownStatus))

# Why a runner went down: set by whoever saw it go (the runner itself, or its worker reading the
# process's exit), so nobody has to read it out of the human `detail` text.
RunnerStatusCause = Literal[
    "peer_lost",  # its ring group broke because another rank went away: a casualty, not a culprit
    "killed",  # its process was killed by a signal (SIGKILL, the OOM killer)
    "exited",  # its process exited on its own (a crash, an exit status)
    "error",  # the runner caught an exception and reported it
    "terminated",  # asked to stop (SIGTERM), it did
]

# --- nodes (`NodeJoined`) ------------------------------------------------------------------------

# Why a worker announces its node. Only the worker says its node is up: see `NodeJoined`.
JoinCause = Literal[
    "start",  # the worker started
    "reconnect",  # its NATS connection came back: the log may have lost or timed it out meanwhile
    "timed_out",  # it folded its own node's `NodeTimedOut` while alive (a pause, a partition)
    "left",  # it folded a `NodeLeft` of its node while alive (a stale incarnation's goodbye)
]

# Why the master retired an instance (`InstanceRetired.cause`): whether its model is to blame
# decides if the retirement counts as a failed placement (`services/master/placement.py`).
RetireCause = Literal[
    "runner_down",  # a rank failed or stopped (a load error, a crash, a kill)
    "node_gone",  # a node hosting a rank left or timed out: a stop, not the model's fault
    "stalled",  # a task on it made no progress (the watchdog)
    "peer_lost",  # ranks lost a peer that never reported (the watchdog's grace ran out)
    "load_deadline",  # it did not become ready within `instance_ready_timeout_seconds`
    "idle",  # it served nothing for its model's keep-alive
    "evicted",  # idle, and its memory was needed to place another model
    "unloaded",  # an operator unloaded its model
    "moved",  # an instance on fewer nodes took over from it
]

# --- tasks ---------------------------------------------------------------------------------------

PrefillPath = Literal["pipeline", "sequential"]
FinishReason = Literal["stop", "length", "cancelled"]
CancelReason = Literal[
    "client_disconnect", "api", "deadline", "shutdown", "server_error"
]  # server_error: a bug in the API ended the request

# --- sampling: OpenAI's bounds on a request's logit adjustments (the API refuses past them, and
# the sampling rank checks them again) ---------------------------------------------------------

PENALTY_BOUND = 2.0  # presence_penalty and frequency_penalty: [-2, 2]
BIAS_BOUND = 100.0  # a logit_bias value: [-100, 100]
MAX_BIASED_TOKENS = 300  # tokens one request may bias: its task's event stays small

# --- the log's two streams -----------------------------------------------------------------------

StreamKey = Literal["events", "telemetry"]  # SHOAL_EVENTS and SHOAL_TELEMETRY
