"""The garbage collector's pauses, for `bot.py` (issue 15: turn overhead).

A full (oldest-generation) collection walks every object the collector tracks, on the
event loop, in one go: at a thousand groups it took 45–105 ms, and every turn waiting
behind it waited that long. Most of what it walked was built by start-up (modules,
classes, NoneBot's and pydantic's tables) and lives as long as the process; the rest is
what the caches keep (decoded histories, wire forms, names), which fill over minutes
and then churn within their bounds.

So: once start-up is done, collect and freeze what is left (`gc.freeze`: the collector no
longer walks it; reference counting still frees it), and after every full collection
freeze its survivors too, so a full collection only walks what was made since the last
one. A frozen object that later dies in a reference cycle is not collected while frozen:
every `unfreeze_every` seconds (an hour) the next full collection is given everything
back (`gc.unfreeze`) and frees such cycles, so frozen garbage lives at most about that
long. That one collection walks the whole heap again.

Process-wide: `bot.py` owns its process and installs it; the plugin itself leaves a host
process's collector alone (a host may install it the same way).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

OLDEST = 2
"""The generation a full collection collects (CPython 3.11–3.13 have three)."""
UNFREEZE_EVERY = 3600.0
"""Seconds between two full collections that walk the whole heap (frozen objects given back)."""


class GcPolicy:
    def __init__(
        self, *, unfreeze_every: float = UNFREEZE_EVERY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._unfreeze_every = unfreeze_every
        self._clock = clock
        self._unfrozen_at = 0.0
        self._started = False

    def start(self) -> int:
        """Collect, freeze what survives, and from now on after every full collection too;
        how many objects are frozen. Idempotent."""
        if not self._started:
            self._started = True
            gc.collect()
            gc.freeze()
            self._unfrozen_at = self._clock()
            gc.callbacks.append(self._after_collection)
        return gc.get_freeze_count()

    def stop(self) -> None:
        """Give the frozen objects back to the collector and stop freezing. Idempotent."""
        if self._started:
            self._started = False
            gc.callbacks.remove(self._after_collection)
            gc.unfreeze()

    def _after_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != OLDEST:
            return
        now = self._clock()
        if now - self._unfrozen_at >= self._unfreeze_every:
            self._unfrozen_at = now
            gc.unfreeze()  # the next full collection walks everything and frees frozen cycles
        else:
            gc.freeze()
