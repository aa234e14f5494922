"""The bounds of the per-session structures the plugin keeps in memory (issue 15: a bot in
thousands of groups must not grow without limit): a dict that keeps only its most recently
written entries (each small and of bounded size, so a count is a byte bound), and locks
per key that exist only while held or waited for.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

SESSIONS_KEPT = 4096
"""Per-session entries each structure keeps (sessions least recently written go first)."""


class LRU(OrderedDict[K, V]):
    """Item assignment marks an entry as fresh; past `maxlen` the stalest go. Reads do not
    count: what is evicted must be cheap to learn again (a read, a default), and an entry
    read often is also written often enough (a session's usage, every turn)."""

    def __init__(self, maxlen: int = SESSIONS_KEPT) -> None:
        super().__init__()
        self.maxlen = maxlen

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxlen:
            self.popitem(last=False)


class KeyedLocks:
    """One FIFO lock per key, kept only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def locked(self, key: str) -> bool:
        """Whether someone holds the key's lock now."""
        entry = self._locks.get(key)
        return entry is not None and entry[0].locked()

    def __len__(self) -> int:
        return len(self._locks)
