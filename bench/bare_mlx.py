"""Bare mlx-lm, no shoal: `stream_generate` in one process, the reference side of `shoal bench e2e`.

Run as `python -m bench.bare_mlx MODEL_DIR PROMPT MAX_TOKENS PREFILL_STEP` by the bench, in a
subprocess with the same BLAS environment as a 1-rank runner and, as a runner does, its Python and
MLX threads pinned to the rank's compute CPU (`runner.affinity`; the bench also runs it unpinned,
as a side of its own, to measure what the pinning is worth). It loads the model, runs two
warm-up generations, prints `ready`, then runs one generation per `go` line read from stdin
(`go` alone: PROMPT; `go <JSON string>`: that prompt, a fresh one for a cold prefill) and
prints one JSON line for each (`{"ttft_ms", "decode_tps", "tokens"}`), so the bench can
interleave it with requests through shoal. Times are those of the first and last piece of
text, as an openai client streaming from shoal sees them, so both sides are timed alike. It exits at the end of stdin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from runner.affinity import COMPUTE_CPU_ENV, compute_cpu_env, pin_compute_threads


def main(argv: list[str]) -> int:
    pin_compute_threads(os.environ)  # first, as a runner does: a no-op where SHOAL_COMPUTE_CPU is unset
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    from runner.models.chat import encode_chat

    model_dir, prompt, max_tokens, step = argv[0], argv[1], int(argv[2]), int(argv[3])
    model, tokenizer = load(model_dir)[:2]

    def one(text: str | None) -> dict[str, Any]:
        tokens = mx.array(encode_chat(tokenizer, [{"role": "user", "content": text or prompt}]))
        started = time.perf_counter()
        first = last = started
        count = 0
        for response in stream_generate(model, tokenizer, tokens, max_tokens=max_tokens, prefill_step_size=step):
            count += 1
            if response.text:  # timed like the client through shoal sees it: when text arrives
                last = time.perf_counter()
                first = last if first == started else first
        rate = (count - 1) / (last - first) if count > 1 and last > first else 0.0
        return {"ttft_ms": (first - started) * 1000, "decode_tps": rate, "tokens": count}

    return serve_stdio(one)


def serve_stdio(
    one: Callable[[str | None], dict[str, Any]],
    warmups: int = 2,
    commands: Mapping[str, Callable[[str], dict[str, Any]]] | None = None,
) -> int:
    """The side's half of the protocol: `warmups` unmeasured runs of the side's own prompt
    (compile, allocate, fill caches), `ready`, then one run and its JSON line per `go` read (with
    the prompt that follows it, as a JSON string, or the side's own), or per line naming one of the
    side's other `commands` (given the rest of the line), until stdin ends."""
    for _ in range(warmups):
        one(None)
    print("ready", flush=True)
    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "go":
            print(json.dumps(one(json.loads(rest) if rest else None)), flush=True)
        elif commands and command in commands:
            print(json.dumps(commands[command](rest)), flush=True)
    return 0


class StdioSide:
    """A bench side in a process of its own that speaks `main`'s protocol (`ready`, then one JSON
    line per `go`), kept up for the whole bench: one `generate()` per request."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr_path: Path) -> None:
        self._stderr_path = stderr_path
        with self._stderr_path.open("wb") as stderr:
            self._process = subprocess.Popen(
                argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        stdin, stdout = self._process.stdin, self._process.stdout
        if stdin is None or stdout is None:  # never with PIPE: this keeps the types honest
            raise RuntimeError(f"{argv[2]}: no pipes")
        self._stdin: IO[str] = stdin
        self._stdout: IO[str] = stdout

    def __enter__(self) -> StdioSide:
        if self._line(lambda line: line == "ready") is None:
            self._process.kill()
            self._process.wait()
            raise RuntimeError(f"{self._stderr_path.stem} did not start: {self._stderr_tail()}")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def generate(self, prompt: str | None = None) -> dict[str, Any]:
        """One run: of `prompt` (a side that takes one: `serve_stdio`'s), else of the side's own."""
        return self.ask("go" if prompt is None else f"go {json.dumps(prompt)}")

    def ask(self, line: str) -> dict[str, Any]:
        """Send one command line (`go ...`, or another the side serves) and read its JSON answer."""
        self._stdin.write(f"{line}\n")
        self._stdin.flush()
        answer = self._line(lambda text: text.startswith("{"))
        if answer is None:
            raise RuntimeError(f"{self._stderr_path.stem} exited: {self._stderr_tail()}")
        return json.loads(answer)

    def _line(self, wanted: Callable[[str], bool]) -> str | None:
        """The next line `wanted` accepts (a library may print to stdout too); None at the end."""
        for raw in self._stdout:
            if wanted(raw.strip()):
                return raw.strip()
        return None

    def _stderr_tail(self) -> str:
        return self._stderr_path.read_text(errors="replace")[-2000:]


def bare_mlx(
    env: dict[str, str], model_dir: str, prompt: str, max_tokens: int, step: int, log_dir: Path, *, pinned: bool = True
) -> StdioSide:
    """The bare mlx-lm process, with a 1-rank runner's BLAS environment and, `pinned`, its compute
    CPU (as `shoal up`'s runners and the engine-alone side have)."""
    from runner.blas import blas_env

    child_env = {**env, **blas_env(env.get("SHOAL_BLAS"), 1, os.cpu_count() or 1, env)}
    child_env.pop(COMPUTE_CPU_ENV, None)
    if pinned:
        child_env |= compute_cpu_env(0, 1)
    argv = [sys.executable, "-m", "bench.bare_mlx", model_dir, prompt, str(max_tokens), str(step)]
    return StdioSide(argv, child_env, log_dir / f"bare_mlx{'' if pinned else '_unpinned'}.err")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
