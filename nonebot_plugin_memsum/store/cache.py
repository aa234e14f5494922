"""The active history of recently busy sessions, kept decoded in memory.

A turn reads the whole active history once per model call, and the compression reads
it again; decoding every row from SQLite each time (JSON of tool calls and metadata
included) was most of a turn's bookkeeping. The store keeps each session's tail here:
a write through the store appends to it, anything else that changes a session's rows
(archiving, clearing, a rolled-back transaction) drops it, and the next read reloads
it once. Bounded by sessions and by approximate bytes, least recently used first out.

With several processes on one PostgreSQL database each entry keeps the session's write
counter as of its load (one more per message this process appended since); the store
compares it with the database's before serving the entry.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

from nonebot_plugin_memsum.types import Message

MAX_SESSIONS = 64
"""Sessions kept: a busy session's turns come back within seconds; one quiet while 64 others
spoke gains little from staying (at a thousand groups a bound of 256 sessions kept growing
for minutes as their histories did, issue 15)."""
MAX_BYTES = 64 << 20
_PER_MESSAGE = 800
"""Bytes a decoded Message costs beyond its text: the object, its fields (the name, the
platform id, the time, the ids, the metadata dict), the list slot. tracemalloc measures about
670 bytes for a decoded 25-character group message read from SQLite, 830 from PostgreSQL
(tests/test_store_cache.py)."""
_PER_WIRE = 250
"""Bytes of the wire form a sent message carries (`Message.wire`, agent/wire.py) beyond its
JSON text: the dict (its content is the message's own string) and the bytes object's header;
tracemalloc measures about 200 for a 40-character group message's dict and 150 for its JSON."""


def message_bytes(m: Message) -> int:
    """Approximate memory of one decoded message with the wire form it gets when first sent:
    CPython keeps CJK text at 2 bytes a character, its JSON at 3."""
    text = len(m.content) + sum(len(c.arguments) + len(c.name) for c in m.tool_calls)
    return _PER_MESSAGE + _PER_WIRE + 5 * text


@dataclass
class _Entry:
    messages: list[Message]
    size: int
    version: int = 0


@dataclass
class HistoryCache:
    """Session id → its active history in storage order, LRU by sessions and bytes."""

    max_sessions: int = MAX_SESSIONS
    max_bytes: int = MAX_BYTES
    _entries: OrderedDict[str, _Entry] = field(default_factory=OrderedDict)
    _bytes: int = 0
    data_version: int | None = None
    """SQLite's `PRAGMA data_version` when the entries were last known to match the file: it
    moves when another connection commits, and then nothing cached can be trusted."""

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, session_id: str) -> list[Message] | None:
        """The cached history (the cache's own list: copy before handing it out)."""
        entry = self._entries.get(session_id)
        if entry is None:
            return None
        self._entries.move_to_end(session_id)
        return entry.messages

    def version(self, session_id: str) -> int | None:
        """The write counter the cached history is as of (None: not cached)."""
        entry = self._entries.get(session_id)
        return None if entry is None else entry.version

    def put(self, session_id: str, messages: list[Message], version: int = 0) -> None:
        self.drop(session_id)
        entry = _Entry(messages, sum(map(message_bytes, messages)), version)
        if entry.size > self.max_bytes:
            return  # one session alone over the bound: read it from the store each time
        self._entries[session_id] = entry
        self._bytes += entry.size
        self._evict()

    def append(self, session_id: str, msg: Message) -> None:
        """A message just stored for the session, if its history is cached."""
        entry = self._entries.get(session_id)
        if entry is None:
            return
        size = message_bytes(msg)
        entry.messages.append(msg)
        entry.size += size
        entry.version += 1
        self._bytes += size
        self._entries.move_to_end(session_id)
        self._evict()

    def name(self, session_id: str, text: str, platform_id: str) -> None:
        """`Tx.name_answer` on the cached history: its newest assistant message without a
        platform id gets `platform_id` when its content is `text` (the same rule as the
        statement), so the next read needs no reload (issue 9: no stored row decoded twice)."""
        entry = self._entries.get(session_id)
        if entry is None:
            return
        for i in range(len(entry.messages) - 1, -1, -1):
            m = entry.messages[i]
            if m.role == "assistant" and m.platform_id is None:
                if m.content == text:
                    entry.messages[i] = replace(m, platform_id=platform_id)
                return

    def drop(self, session_id: str) -> None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._bytes -= entry.size

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _evict(self) -> None:
        while self._entries and (len(self._entries) > self.max_sessions or self._bytes > self.max_bytes):
            _, entry = self._entries.popitem(last=False)
            self._bytes -= entry.size


__all__ = ["HistoryCache", "message_bytes"]
