"""What NoneBot's logger (loguru) writes, captured for a test to read."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from nonebot.log import logger


@contextmanager
def captured(level: str) -> Iterator[list[str]]:
    """Every message at `level` or above while inside, with its traceback if it has one."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level=level, format="{message}")
    try:
        yield lines
    finally:
        logger.remove(sink)
