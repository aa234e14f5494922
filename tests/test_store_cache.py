"""The store's history cache (issue 9): a turn decodes no stored row twice, and the
cache never shows a history the file does not hold: write, archive (compression),
clear, rollback and restart, on a real SQLite file.

To tell a cached read from a read of the file, a row is slipped in through a second,
plain sqlite3 connection: a cached history does not show it, a reloaded one does.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.store.cache import HistoryCache, message_bytes
from nonebot_plugin_memsum.types import Message, ToolCall

SID = "onebot:group:9"
OTHER = "onebot:group:10"


def _slip_in(path: Path, session_id: str, content: str) -> None:
    """A row written behind the store's back (another process, a hand edit)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute(
            "INSERT INTO messages (session_id, role, content, ts) VALUES (?, 'user', ?, 1.0)",
            (session_id, content),
        )
        conn.commit()
    finally:
        conn.close()


def _texts(history: list[Message]) -> list[str]:
    return [m.content for m in history]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store(tmp_path / "memsum.db")
    await s.open()
    yield s
    await s.close()


async def _filled(store: Store, n: int = 3) -> list[Message]:
    for i in range(n):
        await store.append(SID, Message(role="user", content=f"m{i}", name="1", ts=float(i + 1)))
    return await store.get_history(SID)


async def test_a_whole_read_is_served_from_memory_and_store_writes_extend_it(store: Store) -> None:
    first = await _filled(store)
    _slip_in(store.path, SID, "behind")
    assert _texts(await store.get_history(SID)) == ["m0", "m1", "m2"]  # no second decode
    call = ToolCall("c1", "todo", '{"t": 1}')
    appended = await store.append(SID, Message(role="assistant", content="", tool_calls=(call,), ts=9.0))
    history = await store.get_history(SID)
    assert _texts(history) == ["m0", "m1", "m2", ""]
    assert history[-1] == appended
    assert history[-1].id is not None
    assert history[:3] == first
    assert _texts(await store.get_history(SID, 2)) == ["m2", ""]
    assert await store.get_history(SID, 0) == []
    # A caller's list is its own: changing it leaves the cache alone.
    history.clear()
    assert len(await store.get_history(SID)) == 4


async def test_archiving_a_span_drops_the_cached_history(store: Store) -> None:
    await _filled(store, 4)
    async with store.transaction() as tx:
        await tx.archive_span(SID, 3, keep=[1])
        await tx.append(SID, Message(role="system", content="对话已压缩", event_marker=True, ts=5.0))
    assert _texts(await store.get_history(SID)) == ["m1", "m3", "对话已压缩"]
    await store.archive_span(SID, 1)
    assert _texts(await store.get_history(SID)) == ["m3", "对话已压缩"]


async def test_clearing_drops_the_cached_history(store: Store) -> None:
    await _filled(store)
    await store.clear(SID, "summary")
    assert _texts(await store.get_history(SID)) == ["m0", "m1", "m2"]
    await store.clear(SID, "context")
    assert await store.get_history(SID) == []
    await store.append(SID, Message(role="user", content="again", ts=7.0))
    assert _texts(await store.get_history(SID)) == ["again"]


async def test_deleting_the_session_drops_the_cached_history(store: Store) -> None:
    await _filled(store)
    await store.delete_session(SID)
    assert await store.get_history(SID) == []


async def test_a_rolled_back_transaction_leaves_no_phantom(store: Store) -> None:
    await _filled(store)

    class Boom(Exception):
        pass

    async def write_then_fail() -> None:
        async with store.transaction() as tx:
            await tx.append(SID, Message(role="user", content="phantom", ts=8.0))
            raise Boom

    with pytest.raises(Boom):
        await write_then_fail()
    assert _texts(await store.get_history(SID)) == ["m0", "m1", "m2"]


async def test_a_restart_reads_the_file(tmp_path: Path) -> None:
    store = Store(tmp_path / "memsum.db")
    await store.open()
    await _filled(store)
    _slip_in(store.path, SID, "behind")
    await store.close()
    await store.open()  # the same object, reopened: nothing survives in memory
    try:
        assert _texts(await store.get_history(SID)) == ["m0", "m1", "m2", "behind"]
    finally:
        await store.close()
    again = Store(tmp_path / "memsum.db")
    await again.open()
    try:
        assert _texts(await again.get_history(SID)) == ["m0", "m1", "m2", "behind"]
    finally:
        await again.close()


async def test_other_sessions_are_untouched_by_a_write(store: Store) -> None:
    await _filled(store)
    await store.append(OTHER, Message(role="user", content="x", ts=1.0))
    assert _texts(await store.get_history(OTHER)) == ["x"]
    await store.clear(OTHER, "context")
    assert _texts(await store.get_history(SID)) == ["m0", "m1", "m2"]


def test_the_cache_is_bounded_by_sessions_and_bytes_least_recently_used_first() -> None:
    msg = Message(role="user", content="字" * 100)
    cache = HistoryCache(max_sessions=2, max_bytes=10 * message_bytes(msg))
    cache.put("a", [msg])
    cache.put("b", [msg])
    assert cache.get("a") == [msg]  # a is now the most recent
    cache.put("c", [msg])
    assert "b" not in cache
    assert "a" in cache
    assert "c" in cache
    for _ in range(9):  # a's one and c's ten: over the bytes, so the older session goes
        cache.append("c", msg)
    assert "a" not in cache
    assert len(cache.get("c") or []) == 10
    assert cache.size_bytes == 10 * message_bytes(msg)
    cache.put("huge", [msg] * 11)  # one session over the byte bound is not kept at all
    assert "huge" not in cache
    assert cache.size_bytes == 10 * message_bytes(msg)
    cache.drop("c")
    assert len(cache) == 0
    assert cache.size_bytes == 0


# ---- the usage ledger: written in batches, never lost at close (issue 9) ------------------------
def _ledger_rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])
    finally:
        conn.close()


async def test_usage_rows_wait_in_memory_and_any_ledger_query_sees_them(store: Store) -> None:
    await store.record_usage(SID, "对话", "m", 100, 5, 20)
    await store.record_usage(SID, "摘要", "m", 900, 50)
    assert _ledger_rows(store.path) == 0  # no trip to the database per call
    assert await store.usage_totals(SID) == {"对话": (100, 5), "摘要": (900, 50)}
    assert _ledger_rows(store.path) == 2
    await store.record_usage(SID, "对话", "m", 10, 1)
    await store.flush_ledger()
    assert _ledger_rows(store.path) == 3


async def test_usage_rows_are_written_at_close_and_by_the_timer(tmp_path: Path) -> None:
    store = Store(tmp_path / "memsum.db")
    await store.open()
    await store.record_usage(SID, "对话", "m", 100, 5)
    await store.close()  # a shutdown loses nothing
    assert _ledger_rows(tmp_path / "memsum.db") == 1
    await store.open()
    try:
        await store.record_usage(SID, "对话", "m", 100, 5)
        for _ in range(500):  # LEDGER_DELAY later, with nobody asking
            if _ledger_rows(tmp_path / "memsum.db") == 2:
                break
            await asyncio.sleep(0.02)
        assert _ledger_rows(tmp_path / "memsum.db") == 2
    finally:
        await store.close()
