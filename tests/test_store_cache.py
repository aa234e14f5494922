"""The store's history cache (issue 9): a turn decodes no stored row twice, and the
cache never shows a history the file does not hold: write, archive (compression),
clear, rollback and restart, on both engines (a SQLite file, a PostgreSQL database).

To tell a cached read from a read of the file, a row is slipped in through a second,
plain sqlite3 connection: a cached history does not show it, a reloaded one does. On
PostgreSQL such a row is another process's write, which the cache must show at once
(the session's write counter changed); there a cached read is told by the identity of
the decoded messages.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from pathlib import Path

import pytest

from nonebot_plugin_memsum.agent.wire import wire_forms
from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.store.cache import HistoryCache, message_bytes
from nonebot_plugin_memsum.types import Message, ToolCall
from tests.fakes.pgdb import raw

SID = "onebot:group:9"
OTHER = "onebot:group:10"


async def _slip_in(location: Path | str, session_id: str, content: str) -> None:
    """A row written behind the store's back (another process, a hand edit)."""
    await raw(
        location,
        "INSERT INTO messages (session_id, role, content, ts) VALUES (?, 'user', ?, 1.0)",
        (session_id, content),
    )


def _texts(history: list[Message]) -> list[str]:
    return [m.content for m in history]


async def _filled(store: Store, n: int = 3) -> list[Message]:
    for i in range(n):
        await store.append(SID, Message(role="user", content=f"m{i}", name="1", ts=float(i + 1)))
    return await store.get_history(SID)


async def test_a_whole_read_is_served_from_memory_and_store_writes_extend_it(store: Store) -> None:
    first = await _filled(store)
    assert (await store.get_history(SID))[0] is first[0]  # no second decode
    call = ToolCall("c1", "todo", '{"t": 1}')
    appended = await store.append(SID, Message(role="assistant", content="", tool_calls=(call,), ts=9.0))
    history = await store.get_history(SID)
    assert _texts(history) == ["m0", "m1", "m2", ""]
    assert history[-1] is appended  # extended by the store's own write, not reloaded
    assert history[-1].id is not None
    assert history[:3] == first
    assert history[0] is first[0]
    assert _texts(await store.get_history(SID, 2)) == ["m2", ""]
    assert await store.get_history(SID, 0) == []
    # A caller's list is its own: changing it leaves the cache alone.
    history.clear()
    assert len(await store.get_history(SID)) == 4
    await _slip_in(store.location, SID, "behind")
    if store.shared:  # another process wrote the session: shown at once
        assert _texts(await store.get_history(SID)) == ["m0", "m1", "m2", "", "behind"]
    else:  # one process alone writes a SQLite file: what it cached is what is stored
        assert _texts(await store.get_history(SID)) == ["m0", "m1", "m2", ""]


async def test_a_committed_transaction_extends_the_cached_history(store: Store) -> None:
    # A turn stores its answer and the reply mark in one transaction: the next turn must not
    # decode the whole history again for it.
    first = await _filled(store)
    async with store.transaction() as tx:
        answer = await tx.append(SID, Message(role="assistant", content="答", ts=8.0))
    history = await store.get_history(SID)
    assert _texts(history) == ["m0", "m1", "m2", "答"]
    assert history[0] is first[0]  # the cache, extended
    assert history[-1] == answer


async def test_an_answers_platform_id_is_in_the_cached_history_without_a_reload(store: Store) -> None:
    # The OneBot layer names the answer's message id after sending it: every answered turn.
    # The next read shows the id (the backfill matches by it) and decodes nothing again.
    first = await _filled(store)
    await store.append(SID, Message(role="assistant", content="旧答", ts=7.0))
    await store.append(SID, Message(role="assistant", content="答", ts=8.0))
    await store.name_answer(SID, "不是它", "111")  # another text: nothing named
    await store.name_answer(SID, "答", "222")
    history = await store.get_history(SID)
    assert [m.platform_id for m in history] == [None, None, None, None, "222"]
    if not store.shared:  # PostgreSQL reloads whatever its write counter says
        assert history[0] is first[0]
    reread = Store(store.location)
    await reread.open()
    try:
        assert [m.platform_id for m in await reread.get_history(SID)] == [None, None, None, None, "222"]
    finally:
        await reread.close()


async def test_r_run_11_the_commit_re_read_sees_what_another_connection_wrote(store: Store) -> None:
    # The compression's commit re-reads the history (R-RUN-11): from the cache only while no
    # other connection has written since, else from the database.
    first = await _filled(store)
    async with store.transaction() as tx:
        again = await store.history_in(tx, SID)
    assert _texts(again) == ["m0", "m1", "m2"]
    assert again[0] is first[0]  # no second decode
    await _slip_in(store.location, SID, "behind")
    async with store.transaction() as tx:
        assert _texts(await store.history_in(tx, SID)) == ["m0", "m1", "m2", "behind"]


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


async def test_a_restart_reads_the_file(location: Path | str) -> None:
    store = Store(location)
    await store.open()
    await _filled(store)
    await _slip_in(store.location, SID, "behind")
    await store.close()
    await store.open()  # the same object, reopened: nothing survives in memory
    try:
        assert _texts(await store.get_history(SID)) == ["m0", "m1", "m2", "behind"]
    finally:
        await store.close()
    again = Store(location)
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


async def test_a_decoded_message_takes_no_more_memory_than_the_cache_counts(location: Path | str) -> None:
    # Issue 15: the cache's bound in bytes (and the README's memory ceiling) holds only if
    # what `message_bytes` counts is not below what a decoded group message really takes,
    # with its wire form (agent/wire.py).
    store = Store(location)
    await store.open()
    for i in range(500):
        content = f"[成员{i % 5}(2000{i % 5})] M{i} 随便聊聊第{i}句"
        msg = Message(role="user", content=content, name=str(20000 + i % 5), ts=1e9 + i, platform_id=str(i))
        await store.append(SID, msg)
    await store.close()
    await store.open()  # nothing cached: the read below decodes every row
    try:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        history = await store.get_history(SID)
        for wire in wire_forms(history):  # and the wire form each gets when first sent
            assert wire.encoded
        gc.collect()  # what the read left behind, not what it used on the way
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert len(history) == 500
        assert sum(map(message_bytes, history)) >= held
    finally:
        await store.close()


# ---- the usage ledger: written in batches, never lost at close (issue 9) ------------------------
async def _ledger_rows(location: Path | str) -> int:
    return int((await raw(location, "SELECT COUNT(*) FROM ledger"))[0][0])


async def test_usage_rows_wait_in_memory_and_any_ledger_query_sees_them(store: Store) -> None:
    await store.record_usage(SID, "对话", "m", 100, 5, 20)
    await store.record_usage(SID, "摘要", "m", 900, 50)
    assert await _ledger_rows(store.location) == 0  # no trip to the database per call
    assert await store.usage_totals(SID) == {"对话": (100, 5), "摘要": (900, 50)}
    assert await _ledger_rows(store.location) == 2
    await store.record_usage(SID, "对话", "m", 10, 1)
    await store.flush_ledger()
    assert await _ledger_rows(store.location) == 3


async def test_usage_rows_are_written_at_close_and_by_the_timer(location: Path | str) -> None:
    store = Store(location)
    await store.open()
    await store.record_usage(SID, "对话", "m", 100, 5)
    await store.close()  # a shutdown loses nothing
    assert await _ledger_rows(location) == 1
    await store.open()
    try:
        await store.record_usage(SID, "对话", "m", 100, 5)
        for _ in range(500):  # LEDGER_DELAY later, with nobody asking
            if await _ledger_rows(location) == 2:
                break
            await asyncio.sleep(0.02)
        assert await _ledger_rows(location) == 2
    finally:
        await store.close()
