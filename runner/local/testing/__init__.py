"""Test-only: what a test job asks a local rank to do. Excluded from the wheel (pyproject's
`tool.hatch.build.targets.wheel.exclude`); nothing the product runs imports it.

The multi-rank tests and the benches spawn real rank processes (`python -m runner.local.rank_main`)
from a checkout, so what their jobs ask for is importable there from the package's tree: a job that
sets `"testing": true` has each task run by `jobs.run_test_task` (a request served alone with its
callbacks recorded, a scripted continuous batch: `schedule`, mlx-lm's own reference: `tools`);
`shoal generate`'s jobs never set it.
"""
