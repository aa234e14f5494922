"""The bounds of the per-session structures the plugin keeps in memory (issue 15: a bot in
thousands of groups must not grow without limit): a dict that keeps only its most recently
written entries (each small and of bounded size, so a count is a byte bound), a cache
bounded by entries and by approximate bytes (for values of any size), and locks per key
that exist only while held or waited for.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from nonebot_plugin_memsum import clock

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


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    size: int
    expires: float
    used: float


class BoundedCache(Generic[K, V]):
    """An LRU bounded by entries and by approximate bytes; entries expire after their
    time to live, and entries nobody read for `idle_seconds` are dropped."""

    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        idle_seconds: float,
        size: Callable[[K, V], int],
        now: Callable[[], float] = lambda: clock.now(),
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.idle_seconds = idle_seconds
        self._size = size
        self._now = now
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The live value, marked as just used; None when absent or expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = self._now()
        if entry.expires <= now:
            self.pop(key)
            return None
        entry.used = now
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: K, value: V, ttl: float) -> None:
        self.pop(key)
        now = self._now()
        entry = _Entry(value, self._size(key, value), now + ttl, now)
        self._entries[key] = entry
        self.bytes += entry.size
        self._evict(now)

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.bytes -= entry.size
        return entry.value

    def _evict(self, now: float) -> None:
        # Least recently used first: over a bound, or idle (the order is the order of use).
        while self._entries:
            key, oldest = next(iter(self._entries.items()))
            over = len(self._entries) > self.max_entries or self.bytes > self.max_bytes
            if not over and oldest.used > now - self.idle_seconds:
                return
            self.pop(key)


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
