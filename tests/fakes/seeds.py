"""The seeds of the random drivers (tests/test_audit1*_*.py): a few in every run, all of them
with MEMSUM_MORE_SEEDS=1 (a longer run, nightly or before a release). Every defect a seed
found has its own deterministic test, so the seeds left out of a plain run are coverage of
new interleavings, not of known ones."""

from __future__ import annotations

import os


def seeds(every_run: list[int], more: list[int]) -> list[int]:
    return every_run + (more if os.environ.get("MEMSUM_MORE_SEEDS") else [])
