"""The runners' OpenBLAS environment, tried on the real library: after a matmul on two threads,
its second thread sleeps at once instead of spinning for ~0.1 s on a core the node's other
processes want (runner/blas.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runner.blas import SYSTEM_OPENBLAS_PATHS, blas_env

pytestmark = pytest.mark.timeout(60)

# Matmuls two threads share, then a pause as long as OpenBLAS's default spin: the CPU the process
# takes during the pause is what its idle workers burn.
PROBE = """
import time, resource
import mlx.core as mx
a = mx.random.normal((512, 512))
for _ in range(3):
    mx.eval(a @ a)
before = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
mx.eval(a @ a)
while time.perf_counter() - t < 0.08:
    time.sleep(0.005)
after = resource.getrusage(resource.RUSAGE_SELF)
print(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
"""


def _cpu_during_pause(env: dict[str, str]) -> float:
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip())


@pytest.mark.skipif(not any(os.path.exists(p) for p in SYSTEM_OPENBLAS_PATHS), reason="no system OpenBLAS")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenBLAS runs one thread")
def test_the_second_blas_thread_sleeps_instead_of_spinning() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    ours = {**base, **blas_env("auto", 1, 2, base)}
    default_spin = {k: v for k, v in ours.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    spun = min(_cpu_during_pause(default_spin) for _ in range(2))
    slept = max(_cpu_during_pause(ours) for _ in range(2))
    assert spun > 0.04, f"OpenBLAS's default spin took only {spun:.3f} s of CPU in 0.08 s: nothing to compare"
    assert slept < spun / 2, f"the workers still spin: {slept:.3f} s of CPU against {spun:.3f} s by default"
