"""Bare mlx on a 2-rank ring, no shoal: the least a pipeline of two processes costs per token, the
reference for `shoal bench e2e`'s 2-worker side beside bare mlx-lm in one process.

Two processes on an mlx ring group (the hostfile and BLAS environment of `shoal generate`'s ranks)
each hold the model and split its layers in two halves (llama-family layout: the tiny model's).
Per token rank 0 embeds the token and runs the first half, sends the hidden state to rank 1, which
runs the second half, the norm, the head and an argmax, and sends the token back; each waits for
its peer's bytes in a blocking poll (`runner.ring_wait`), as shoal's ranks do, not in the ring
backend's spin. Nothing else: no agreement, no events, no look-ahead. The prompt's prefill runs
on both ranks through the whole model (it is not what this side measures: its TTFT is not
compared). Rank 0 speaks `bench.bare_mlx`'s protocol on stdin/stdout (`ready`, then one JSON line
per `go`, timed at each token's arrival); rank 1 follows rank 0's commands through the ring.

    python -m bench.bare_pipeline MODEL_DIR PROMPT MAX_TOKENS   (as rank 0 and rank 1 of a ring)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from bench.bare_mlx import StdioSide
from runner.affinity import pin_compute_threads

GENERATE, QUIT = 1, 0


def main(argv: list[str]) -> int:
    pin_compute_threads(os.environ)  # first, as a rank of shoal's does (`rank_env` names its CPU)
    import mlx.core as mx
    from mlx_lm import load

    from runner.blas import BlasThreads
    from runner.models.chat import encode_chat
    from runner.ring_wait import RingInbound

    model_dir, prompt, max_tokens = argv[0], argv[1], int(argv[2])
    BlasThreads.at_share(os.environ)  # as a rank of shoal's starts: its share of the node's cores
    group = mx.distributed.init(backend="ring", strict=True)
    loaded = load(model_dir)
    tokenizer: Any = loaded[1]
    hosts = json.loads(Path(os.environ["MLX_HOSTFILE"]).read_text())
    side = PipelineRank(
        model=loaded[0],
        group=group,
        inbound=RingInbound.find([entry[0] for entry in hosts], group.rank()),
        prompt_ids=mx.array(encode_chat(tokenizer, [{"role": "user", "content": prompt}]))[None],
        eos=set(tokenizer.eos_token_ids),
        max_tokens=max_tokens,
    )
    if side.rank == 1:
        side.follow()
        return 0
    for _ in range(2):  # warm-up: compile, allocate, fill caches
        side.send(mx.array([GENERATE], dtype=mx.int32))
        side.generate()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "go":
            side.send(mx.array([GENERATE], dtype=mx.int32))
            print(json.dumps(side.generate()), flush=True)
    side.send(mx.array([QUIT], dtype=mx.int32))
    return 0


class PipelineRank:
    """One of the two ranks: its half of the layers (rank 0 the first, rank 1 the second, the norm
    and the head), the ring to its peer and the blocking wait for the peer's bytes."""

    def __init__(
        self, *, model: Any, group: Any, inbound: Any, prompt_ids: Any, eos: set[int], max_tokens: int
    ) -> None:
        import mlx.core as mx

        self.mx = mx
        self.model = model  # mlx-lm's llama layout
        self.inner = model.model
        self.split = len(self.inner.layers) // 2
        self.group = group
        self.rank: int = group.rank()
        self.peer = 1 - self.rank
        self.inbound = inbound
        self.prompt_ids = prompt_ids
        self.eos = eos
        self.max_tokens = max_tokens
        self.token_like = mx.array([0], dtype=mx.int32)
        weight = self.inner.embed_tokens.weight
        self.hidden_like = mx.zeros((1, 1, weight.shape[1]), dtype=weight.dtype)

    def receive(self, like: Any) -> Any:
        self.inbound.wait()
        return self.mx.distributed.recv_like(like, self.peer, group=self.group)

    def send(self, array: Any) -> None:
        self.mx.eval(self.mx.distributed.send(array, self.peer, group=self.group))

    def follow(self) -> None:
        """Rank 1: one generation per GENERATE from rank 0, until QUIT."""
        while True:
            while not self.inbound.readable(1.0):  # between requests: no spin while rank 0 waits for the bench
                pass
            if _first(self.mx.distributed.recv_like(self.token_like, 0, group=self.group)) == QUIT:
                return
            self.generate()

    def generate(self) -> dict[str, Any]:
        """Both ranks: one greedy generation; rank 0 returns its timing."""
        from mlx_lm.models.cache import make_prompt_cache

        mx = self.mx
        started = time.perf_counter()
        cache = make_prompt_cache(self.model)
        logits_hidden = self.model(self.prompt_ids, cache=cache)  # the whole model, on both ranks
        token = mx.argmax(logits_hidden[:, -1, :], axis=-1).astype(mx.int32)
        mx.eval(token, *[c.state for c in cache])
        if self.rank == 1:
            self.send(token)
        else:
            token = self.receive(self.token_like)
            mx.eval(token)
        first = last = time.perf_counter()
        count = 1
        while count < self.max_tokens and _first(token) not in self.eos:
            token = self.first_half(token, cache) if self.rank == 0 else self.second_half(cache)
            last = time.perf_counter()
            count += 1
        rate = (count - 1) / (last - first) if count > 1 and last > first else 0.0
        return {"ttft_ms": (first - started) * 1000, "decode_tps": rate, "tokens": count}

    def first_half(self, token: Any, cache: list[Any]) -> Any:
        """Rank 0's step: embed, its layers, send the hidden state; the next token comes back."""
        mx = self.mx
        hidden = self.inner.embed_tokens(token.reshape(1, 1))
        for layer, layer_cache in zip(self.inner.layers[: self.split], cache[: self.split], strict=True):
            hidden = layer(hidden, None, layer_cache)
        mx.eval(mx.distributed.send(hidden, self.peer, group=self.group), *[c.state for c in cache[: self.split]])
        token = self.receive(self.token_like)
        mx.eval(token)
        return token

    def second_half(self, cache: list[Any]) -> Any:
        """Rank 1's step: its layers on the received hidden state, the head, the token sent back."""
        hidden = self.receive(self.hidden_like)
        for layer, layer_cache in zip(self.inner.layers[self.split :], cache[self.split :], strict=True):
            hidden = layer(hidden, None, layer_cache)
        token = self.head(hidden)
        self.mx.eval(token, *[c.state for c in cache[self.split :]])
        self.send(token)
        return token

    def head(self, hidden: Any) -> Any:
        mx = self.mx
        out = self.inner.norm(hidden)
        tied = getattr(getattr(self.model, "args", None), "tie_word_embeddings", True)
        logits = self.inner.embed_tokens.as_linear(out) if tied else self.model.lm_head(out)
        return mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)


def _first(array: Any) -> int:
    return int(cast(list[int], array.tolist())[0])


class BarePipeline:
    """The two ranks, kept up for the whole bench: one `generate()` per request (rank 0's timing)."""

    def __init__(self, env: dict[str, str], model_dir: str, prompt: str, max_tokens: int, log_dir: Path) -> None:
        from runner.local.launch import free_ports, rank_env, ring_hostfile

        self._hostfile = Path(tempfile.mkstemp(prefix="shoal-bare-pipeline-", suffix=".json", dir=log_dir)[1])
        self._hostfile.write_text(json.dumps(ring_hostfile(free_ports(2))))
        argv = [sys.executable, "-m", "bench.bare_pipeline", model_dir, prompt, str(max_tokens)]
        with (log_dir / "bare_pipeline_rank1.err").open("wb") as stderr:
            self._follower = subprocess.Popen(
                argv,
                env=rank_env(1, 2, self._hostfile, env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self._leader = StdioSide(argv, rank_env(0, 2, self._hostfile, env), log_dir / "bare_pipeline_rank0.err")

    def __enter__(self) -> BarePipeline:
        try:
            self._leader.__enter__()
        except BaseException:
            self._stop_follower(at_once=True)  # no rank 0 to tell it to quit
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._leader.__exit__(kind, exc, tb)  # end of stdin: rank 0 sends QUIT
        finally:
            self._stop_follower(at_once=exc is not None)

    def generate(self) -> dict[str, Any]:
        return self._leader.generate()

    def _stop_follower(self, at_once: bool) -> None:
        try:
            self._follower.wait(timeout=0 if at_once else 30)
        except subprocess.TimeoutExpired:
            self._follower.kill()
            self._follower.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
