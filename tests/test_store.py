"""The store on both engines: real SQLite files in tmp_path and fresh PostgreSQL databases
(the `location` fixture); the migration tests of SQLite files are SQLite's own
(PostgreSQL's: tests/test_store_postgres.py).

Plugin modules are imported inside the tests: importing the package needs NoneBot
initialised, which nonebug does only once the session starts.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiosqlite
import pytest

from tests.fakes.pgdb import raw

if TYPE_CHECKING:
    from nonebot_plugin_memsum.store import Store
    from nonebot_plugin_memsum.types import Message

SID = "onebot:group:123"


def _raw(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the file with a second, plain sqlite3 connection: what is really on disk."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _msg(content: str, **kwargs: Any) -> Message:
    from nonebot_plugin_memsum.types import Message

    return Message(role=kwargs.pop("role", "user"), content=content, **kwargs)


def _tool_call_msg(call_id: str, ts: float) -> Message:
    from nonebot_plugin_memsum.types import Message, ToolCall

    return Message(
        role="assistant",
        content="",
        tool_calls=(ToolCall(id=call_id, name="todo", arguments='{"title": "买菜"}'),),
        ts=ts,
        metadata={"visibleContent": "好的", "nested": {"k": [1, 2.5, None, "中文"]}},
    )


# --- migrations ---------------------------------------------------------------


async def test_migrations_blank_to_latest(tmp_path: Path) -> None:
    from nonebot_plugin_memsum.store import Store
    from nonebot_plugin_memsum.store.migrations import MIGRATIONS

    store = Store(tmp_path / "data" / "memsum.db")
    await store.open()
    await store.close()
    assert store.path.exists()
    assert _raw(store.path, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert _raw(store.path, "PRAGMA journal_mode") == [("wal",)]
    tables = {r[0] for r in _raw(store.path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"sessions", "messages", "metadata", "settings", "ledger"} <= tables
    plan = _raw(
        store.path,
        "EXPLAIN QUERY PLAN SELECT id FROM messages WHERE session_id = ? AND archived = 0"
        " ORDER BY id DESC LIMIT 10",
        (SID,),
    )
    assert any("messages_by_session" in str(r[-1]) for r in plan)


async def test_migrations_old_to_latest_runs_only_pending_steps(tmp_path: Path) -> None:
    from nonebot_plugin_memsum.store.migrations import MIGRATIONS, migrate

    ran: list[str] = []

    async def add_column(db: aiosqlite.Connection) -> None:
        ran.append("add_column")
        await db.execute("ALTER TABLE sessions ADD COLUMN title TEXT")

    path = tmp_path / "old.db"
    async with aiosqlite.connect(path, isolation_level=None) as db:
        assert await migrate(db) == 0
        await db.execute(
            "INSERT INTO messages (session_id, role, content, ts) VALUES (?, 'user', 'old', 1.5)", (SID,)
        )
        newer = (*MIGRATIONS, add_column)
        assert await migrate(db, newer) == len(MIGRATIONS)
        assert await migrate(db, newer) == len(newer)  # already latest: nothing runs again
    assert ran == ["add_column"]
    assert _raw(path, "PRAGMA user_version") == [(len(newer),)]
    assert "title" in {r[1] for r in _raw(path, "PRAGMA table_info(sessions)")}
    assert _raw(path, "SELECT content FROM messages") == [("old",)]


async def test_failed_migration_leaves_the_old_schema(tmp_path: Path) -> None:
    from nonebot_plugin_memsum.store.migrations import MIGRATIONS, migrate

    async def half_done(db: aiosqlite.Connection) -> None:
        await db.execute("CREATE TABLE half (x)")
        raise RuntimeError("boom")

    path = tmp_path / "m.db"
    async with aiosqlite.connect(path, isolation_level=None) as db:
        await migrate(db)
        with pytest.raises(RuntimeError, match="boom"):
            await migrate(db, (*MIGRATIONS, half_done))
        assert not db.in_transaction
    assert _raw(path, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert _raw(path, "SELECT name FROM sqlite_master WHERE name = 'half'") == []


async def test_newer_database_refused(tmp_path: Path) -> None:
    from nonebot_plugin_memsum.store import Store, StoreError
    from nonebot_plugin_memsum.store.migrations import MIGRATIONS

    path = tmp_path / "future.db"
    future = len(MIGRATIONS) + 1
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {future}")
    conn.close()

    store = Store(path)
    with pytest.raises(StoreError, match="newer"):
        await store.open()
    assert _raw(path, "PRAGMA user_version") == [(future,)]
    assert _raw(path, "PRAGMA journal_mode") == [("delete",)]
    assert _raw(path, "SELECT name FROM sqlite_master") == []
    with pytest.raises(StoreError, match="not open"):
        await store.get_history(SID)


async def test_not_a_database_refused(tmp_path: Path) -> None:
    from nonebot_plugin_memsum.store import Store, StoreError

    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open") as caught:
        await Store(path).open()
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


# --- history -----------------------------------------------------------------


async def test_append_then_history_in_storage_order_with_limit(store: Store) -> None:
    stored = [await store.append(SID, _msg(f"m{i}", ts=100.0 + i)) for i in range(5)]
    await store.append("other", _msg("elsewhere", ts=1.0))

    ids = [m.id for m in stored if m.id is not None]
    assert len(ids) == 5
    assert all(x < y for x, y in itertools.pairwise(ids))
    history = await store.get_history(SID)
    assert history == stored
    assert [m.content for m in await store.get_history(SID, 2)] == ["m3", "m4"]
    assert await store.get_history(SID, 0) == []
    assert await store.get_history(SID, 99) == stored
    assert await store.get_history(SID, 1e300) == stored
    assert await store.get_history("nobody") == []


async def test_timestamps_keep_sub_second_precision(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from nonebot_plugin_memsum import clock

    monkeypatch.setattr(clock, "now", lambda: 1712345678.987654)
    given = await store.append(SID, _msg("given", ts=1700000000.123456))
    defaulted = await store.append(SID, _msg("defaulted"))

    assert defaulted.ts == 1712345678.987654
    assert [m.ts for m in await store.get_history(SID)] == [1700000000.123456, 1712345678.987654]
    assert given.ts == 1700000000.123456


async def test_message_fields_round_trip(store: Store) -> None:
    call = _tool_call_msg("call_1", ts=10.25)
    result = _msg('{"ok": true}', role="tool", name="todo", tool_call_id="call_1", ts=10.5)
    marker = _msg("对话已压缩", role="system", event_marker=True, ts=11.0, metadata={"kind": "divider"})
    originals = [call, result, marker]

    stored = [await store.append(SID, m) for m in originals]
    history = await store.get_history(SID)

    assert history == [replace(m, id=s.id) for m, s in zip(originals, stored, strict=True)]
    assert isinstance(history[0].tool_calls, tuple)
    assert history[0].metadata == {"visibleContent": "好的", "nested": {"k": [1, 2.5, None, "中文"]}}
    assert history[1].metadata == {}


async def test_every_message_field_reads_back_as_the_dataclass_would_build_it(store: Store) -> None:
    """The store builds a read Message by setting its slots, not through its __init__
    (store._message_from_row): every field comes back, and the result equals, hashes and
    prints like the same Message built the ordinary way."""
    from dataclasses import fields

    from nonebot_plugin_memsum.types import Message, ToolCall

    original = Message(
        role="assistant",
        content="看这个",
        name="bot",
        tool_calls=(ToolCall(id="c1", name="recall", arguments='{"q": "爬山"}'),),
        tool_call_id="c0",
        ts=3.5,
        metadata={"visibleContent": "看"},
        event_marker=True,
        tokens=17,
        platform_id="p-9",
        addressed=True,
    )
    stored = await store.append(SID, original)
    store._history.clear()  # decoded from the row, not served from the history cache
    (got,) = await store.get_history(SID)

    names = [f.name for f in fields(Message)]
    assert [getattr(got, n) for n in names] == [getattr(stored, n) for n in names]
    built = Message(**{f.name: getattr(got, f.name) for f in fields(Message) if f.init})
    assert got.wire is None  # the wire form's memo starts empty (agent/wire.py)
    assert got == built
    assert hash(got) == hash(built)
    assert repr(got) == repr(built)


async def test_huge_content_stores_fine(store: Store) -> None:
    content = "长" * 1_000_000 + "end"
    await store.append(SID, _msg(content, ts=1.0))
    (got,) = await store.get_history(SID)
    assert got.content == content


async def test_r_trig_4_count_active_leaves_out_markers_and_system(store: Store) -> None:
    await store.append(SID, _msg("a", ts=1.0))
    await store.append(SID, _msg("b", role="assistant", ts=2.0))
    await store.append(SID, _msg("n", role="notice", ts=3.0))
    await store.append(SID, _msg("对话已压缩", role="system", event_marker=True, ts=4.0))
    await store.append(SID, _msg("persona", role="system", ts=5.0))
    await store.append(SID, _msg("silent turn", role="assistant", event_marker=True, ts=6.0))
    assert await store.count_active(SID) == 3
    await store.archive_span(SID, 1)
    assert await store.count_active(SID) == 2


# --- archive ------------------------------------------------------------------


async def test_r_run_12_kept_originals_untouched(store: Store) -> None:
    originals = [
        _msg("[甲(1)] 早", ts=1.125, metadata={"sender": "1"}),
        _tool_call_msg("call_9", ts=2.5),
        _msg("结果", role="tool", name="todo", tool_call_id="call_9", ts=2.75),
        _msg("[乙(2)] 午", ts=3.0),
        _msg("[丙(3)] 晚", ts=4.0),
        _msg("after the cut", ts=5.0),
    ]
    stored = [await store.append(SID, m) for m in originals]

    archived = await store.archive_span(SID, 5, keep={1, 2})

    assert archived == 3
    # Kept ones are exactly what was stored, ordered before the messages after the cut.
    assert await store.get_history(SID) == [stored[1], stored[2], stored[5]]
    assert await store.get_archived(SID) == [stored[0], stored[3], stored[4]]
    assert await store.get_archived(SID, 1) == [stored[4]]


async def test_archive_span_longer_than_history_refused_with_nothing_changed(store: Store) -> None:
    from nonebot_plugin_memsum.store import StoreError

    stored = [await store.append(SID, _msg(f"m{i}", ts=float(i))) for i in range(3)]

    with pytest.raises(StoreError, match="only 3 active"):
        await store.archive_span(SID, 4)
    with pytest.raises(StoreError, match="outside"):
        await store.archive_span(SID, 2, keep={2})
    assert await store.get_history(SID) == stored
    assert await store.get_archived(SID) == []
    assert await store.archive_span(SID, 0) == 0


# --- transactions and concurrency ----------------------------------------------


async def test_two_concurrent_writers_all_present_in_order(store: Store) -> None:
    n = 150

    async def writer(tag: str) -> None:
        for i in range(n):
            await store.append(SID, _msg(f"{tag}{i}", ts=1.0))

    await asyncio.gather(writer("a"), writer("b"))

    history = await store.get_history(SID)
    ids = [m.id for m in history if m.id is not None]
    assert len(ids) == 2 * n
    assert all(x < y for x, y in itertools.pairwise(ids))
    for tag in "ab":
        assert [m.content for m in history if m.content.startswith(tag)] == [f"{tag}{i}" for i in range(n)]


async def test_a_transaction_is_not_interleaved_with_other_writers(store: Store) -> None:
    async def block() -> None:
        async with store.transaction() as tx:
            for i in range(20):
                await tx.append(SID, _msg(f"tx{i}", ts=1.0))
                await asyncio.sleep(0)

    async def single() -> None:
        for i in range(20):
            await store.append(SID, _msg(f"single{i}", ts=1.0))
            await asyncio.sleep(0)

    await asyncio.gather(single(), block(), single())

    contents = [m.content for m in await store.get_history(SID)]
    first = contents.index("tx0")
    assert contents[first : first + 20] == [f"tx{i}" for i in range(20)]


async def test_reads_never_see_another_coroutines_uncommitted_writes(store: Store) -> None:
    reader_waiting = asyncio.Event()

    async def reader() -> list[Message]:
        reader_waiting.set()
        return await store.get_history(SID)

    reads: list[asyncio.Task[list[Message]]] = []

    async def write_then_fail() -> None:
        async with store.transaction() as tx:
            await tx.append(SID, _msg("uncommitted", ts=1.0))
            reads.append(asyncio.create_task(reader()))
            await reader_waiting.wait()  # the reader now waits for the lock
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError, match="abort"):
        await write_then_fail()
    assert await reads[0] == []


async def test_r_run_11_transaction_rolled_back_on_error_leaves_nothing(store: Store) -> None:
    from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE

    async def commit_then_fail() -> None:
        async with store.transaction() as tx:
            await tx.put_meta(SUMMARY_NAMESPACE, SID, "new summary")
            await tx.archive_span(SID, 1)
            await tx.append(SID, _msg("对话已压缩", role="system", event_marker=True, ts=2.0))
            raise ValueError("history changed")

    await store.append(SID, _msg("before", ts=1.0))
    with pytest.raises(ValueError, match="history changed"):
        await commit_then_fail()

    assert [m.content for m in await store.get_history(SID)] == ["before"]
    assert await store.get_meta(SUMMARY_NAMESPACE, SID) is None
    assert await store.get_archived(SID) == []


async def test_cancellation_inside_transaction_rolls_back(store: Store) -> None:
    appended = asyncio.Event()

    async def writer() -> None:
        async with store.transaction() as tx:
            for i in range(1000):
                await tx.append(SID, _msg(f"m{i}", ts=1.0))
                appended.set()
            await asyncio.Event().wait()

    # Cancel at different moments, including while an append is still in flight.
    for spins in (0, 1, 3, 10):
        appended.clear()
        task = asyncio.create_task(writer())
        await appended.wait()
        for _ in range(spins):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await store.get_history(SID) == []

    # The lock was released: the store still works.
    await store.append(SID, _msg("after", ts=2.0))
    assert [m.content for m in await store.get_history(SID)] == ["after"]


async def test_nested_store_call_inside_transaction_raises(store: Store) -> None:
    from nonebot_plugin_memsum.store import StoreError

    async def store_call_inside() -> None:
        async with store.transaction() as tx:
            await tx.append(SID, _msg("inside", ts=1.0))
            await store.get_history(SID)

    async def transaction_inside() -> None:
        async with store.transaction(), store.transaction():
            pass

    async with asyncio.timeout(10):  # a regression would hang on the lock instead
        with pytest.raises(StoreError, match="call the method on the Tx"):
            await store_call_inside()
        with pytest.raises(StoreError, match="call the method on the Tx"):
            await transaction_inside()
        assert await store.get_history(SID) == []


async def test_tx_used_after_its_transaction_refused(store: Store) -> None:
    from nonebot_plugin_memsum.store import StoreError

    async with store.transaction() as tx:
        await tx.append(SID, _msg("in", ts=1.0))
    with pytest.raises(StoreError, match="already ended"):
        await tx.append(SID, _msg("late", ts=2.0))
    assert [m.content for m in await store.get_history(SID)] == ["in"]


async def test_task_spawned_inside_transaction_writes_after_commit(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.append(SID, _msg("first", ts=1.0))
        later = asyncio.create_task(store.append(SID, _msg("second", ts=2.0)))
        await asyncio.sleep(0)
    await later
    assert [m.content for m in await store.get_history(SID)] == ["first", "second"]


async def test_driver_errors_become_store_errors_with_cause(store: Store) -> None:
    import asyncpg

    from nonebot_plugin_memsum.store import StoreError

    with pytest.raises(StoreError) as caught:
        await store.append(SID, _msg("x", role="robot", ts=1.0))
    assert isinstance(caught.value.__cause__, sqlite3.IntegrityError | asyncpg.CheckViolationError)
    with pytest.raises(StoreError, match="JSON"):
        await store.put_meta("ns", "k", object())
    assert await store.get_history(SID) == []
    assert await store.get_meta("ns", "k") is None


# --- metadata, clearing, settings, ledger, sessions -----------------------------


async def test_r_mem_1_summary_in_metadata_namespace(store: Store) -> None:
    from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE

    summary = {"text": "【最近在聊什么】\n周末爬山", "template": "chat"}
    await store.put_meta(SUMMARY_NAMESPACE, SID, summary)
    await store.append(SID, _msg("hi", ts=1.0))

    assert SUMMARY_NAMESPACE == "summary"
    assert await store.get_meta("summary", SID) == summary
    # Same file as the history.
    assert await raw(store.location, "SELECT namespace, key FROM metadata") == [("summary", SID)]
    assert await raw(store.location, "SELECT COUNT(*) FROM messages") == [(1,)]
    await store.put_meta(SUMMARY_NAMESPACE, SID, "replaced")
    assert await store.get_meta(SUMMARY_NAMESPACE, SID) == "replaced"
    await store.delete_meta(SUMMARY_NAMESPACE, SID)
    assert await store.get_meta(SUMMARY_NAMESPACE, SID) is None


async def test_r_mem_2_clear_context_also_clears_summary(store: Store) -> None:
    from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE

    stored = [await store.append(SID, _msg(f"m{i}", ts=float(i))) for i in range(3)]
    await store.append("other", _msg("stays", ts=1.0))
    await store.put_meta(SUMMARY_NAMESPACE, SID, "summary")
    await store.put_meta(SUMMARY_NAMESPACE, "other", "other summary")
    await store.put_meta("another", SID, "not a summary")

    await store.clear(SID, "context")

    assert await store.get_history(SID) == []
    assert await store.count_active(SID) == 0
    assert await store.get_archived(SID) == stored  # archived, not lost
    assert await store.get_meta(SUMMARY_NAMESPACE, SID) is None
    assert await store.get_meta(SUMMARY_NAMESPACE, "other") == "other summary"
    assert await store.get_meta("another", SID) == "not a summary"
    assert [m.content for m in await store.get_history("other")] == ["stays"]


async def test_r_mem_2_clear_summary_keeps_history(store: Store) -> None:
    from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, StoreError

    stored = [await store.append(SID, _msg(f"m{i}", ts=float(i))) for i in range(2)]
    await store.put_meta(SUMMARY_NAMESPACE, SID, "summary")

    await store.clear(SID, "summary")

    assert await store.get_meta(SUMMARY_NAMESPACE, SID) is None
    assert await store.get_history(SID) == stored
    with pytest.raises(StoreError, match="unknown clear kind"):
        await store.clear(SID, "everything")  # type: ignore[arg-type]


async def test_settings_set_get_replace_delete(store: Store) -> None:
    from nonebot_plugin_memsum.store import StoreError

    await store.set_setting("session", SID, "compress_at", 0.6)
    await store.set_setting("place", "123", "compress_at", 0.7)
    assert (await store.get_settings("session", SID)).get("compress_at") == 0.6
    assert (await store.get_settings("place", "123")).get("compress_at") == 0.7
    assert (await store.get_settings("session", SID)).get("history_limit") is None

    await store.set_setting("session", SID, "compress_at", 0.5)
    assert (await store.get_settings("session", SID)).get("compress_at") == 0.5
    await store.delete_setting("session", SID, "compress_at")
    assert (await store.get_settings("session", SID)).get("compress_at") is None
    assert (await store.get_settings("place", "123")).get("compress_at") == 0.7

    with pytest.raises(StoreError, match="scope"):
        await store.set_setting("group", "123", "compress_at", 0.1)


async def test_ledger_totals_per_purpose(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from nonebot_plugin_memsum import clock

    monkeypatch.setattr(clock, "now", lambda: 42.5)
    await store.record_usage(SID, "chat", "ds/chat", 100, 20)
    await store.record_usage(SID, "chat", "ds/chat", 50, 5)
    await store.record_usage(SID, "摘要", "ds/chat", 1000, 300)
    await store.record_usage("other", "chat", "ds/chat", 7, 7)
    await store.record_usage(None, "probe", "ds/chat", 1, 1)

    assert await store.usage_totals(SID) == {"chat": (150, 25), "摘要": (1000, 300)}
    assert await store.usage_totals("nobody") == {}
    assert await raw(store.location, "SELECT DISTINCT ts FROM ledger") == [(42.5,)]
    assert await raw(store.location, "SELECT COUNT(*) FROM ledger WHERE session_id IS NULL") == [(1,)]


async def test_ledger_keeps_cached_prompt_tokens(store: Store) -> None:
    # A prompt-cache hit costs a fraction of a miss: the ledger keeps it apart (issue 8).
    await store.record_usage(SID, "chat", "ds/chat", 1200, 30, 1024)
    await store.record_usage(SID, "chat", "ds/chat", 100, 5)
    await store.flush_ledger()  # rows are written in batches (issue 9)
    rows = await raw(store.location, "SELECT tokens_in, tokens_out, tokens_cached FROM ledger ORDER BY id")
    assert rows == [
        (1200, 30, 1024),
        (100, 5, 0),
    ]


async def test_save_session_first_write_wins(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from nonebot_plugin_memsum import clock
    from nonebot_plugin_memsum.types import SessionRecord

    monkeypatch.setattr(clock, "now", lambda: 500.25)
    first = SessionRecord(id=SID, platform="onebot", kind="group", place="123", room_class="room")
    child = SessionRecord(id="child", platform=None, kind="internal", parent=SID, created=7.5)

    assert await store.save_session(first) == replace(first, created=500.25)
    assert await store.save_session(replace(first, kind="private", created=9.0)) == replace(
        first, created=500.25
    )
    assert await store.save_session(child) == child
    assert await store.get_session(SID) == replace(first, created=500.25)
    assert await store.get_session("missing") is None


# --- lifecycle ----------------------------------------------------------------


async def test_data_survives_close_and_reopen(location: Path | str) -> None:
    from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, Store, StoreError

    path = location / "deep" / "er.db" if isinstance(location, Path) else location
    store = Store(path)
    await store.open()
    await store.open()  # idempotent
    stored = [await store.append(SID, _msg(f"m{i}", ts=i + 0.5)) for i in range(3)]
    await store.archive_span(SID, 1)
    await store.put_meta(SUMMARY_NAMESPACE, SID, "摘要")
    await store.set_setting("session", SID, "history_limit", 40)
    await store.record_usage(SID, "chat", "ds/chat", 3, 4)
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError, match="not open"):
        await store.append(SID, _msg("closed", ts=9.0))

    reopened = Store(path)
    await reopened.open()
    try:
        assert await reopened.get_history(SID) == stored[1:]
        assert await reopened.get_archived(SID) == stored[:1]
        assert await reopened.get_meta(SUMMARY_NAMESPACE, SID) == "摘要"
        assert (await reopened.get_settings("session", SID)).get("history_limit") == 40
        assert await reopened.usage_totals(SID) == {"chat": (3, 4)}
        later = await reopened.append(SID, _msg("later", ts=9.0))
        assert (later.id or 0) > (stored[-1].id or 0) > 0
    finally:
        await reopened.close()


async def test_a_write_that_fails_at_commit_rolls_back_the_whole_transaction(location: Path | str) -> None:
    # Issue 9: inside a transaction a write nobody reads an answer of (the reply mark) goes to
    # the database with the COMMIT; its failure still fails and rolls back everything.
    from nonebot_plugin_memsum.errors import StoreError
    from nonebot_plugin_memsum.store import Store

    store = Store(location)
    await store.open()
    try:
        kept = await store.append(SID, _msg("问题"))
        assert kept.id is not None
        assert [m.id for m in await store.get_history(SID)] == [kept.id]  # cached now

        async def answer_with_a_bad_mark() -> None:
            async with store.transaction() as tx:
                await tx.append(SID, _msg("回答", role="assistant"))
                await tx.mark_reply(SID, kept.id, "bogus")  # type: ignore[arg-type]  # CHECK refuses it

        with pytest.raises(StoreError):
            await answer_with_a_bad_mark()
        assert [m.content for m in await store.get_history(SID)] == ["问题"]
        assert await store.replies_being_sent() == []
        async with store.transaction():
            pass  # nothing written: nothing to fail
        async with store.transaction() as tx:
            answer = await tx.append(SID, _msg("回答", role="assistant"))
            await tx.mark_reply(SID, kept.id, "sending")
        assert [m.id for m in await store.get_history(SID)] == [kept.id, answer.id]
        assert await store.replies_being_sent() == [(SID, kept.id)]
    finally:
        await store.close()


async def test_an_answer_and_its_reply_mark_commit_together_or_not_at_all(location: Path | str) -> None:
    # Issue 15: a turn's answer and its mark go in one transaction of their own (on SQLite one
    # trip to the database thread); a mark that fails leaves neither, and the history cache
    # stays true either way.
    from nonebot_plugin_memsum.errors import StoreError
    from nonebot_plugin_memsum.store import Store

    store = Store(location)
    await store.open()
    try:
        asked = await store.append(SID, _msg("问题"))
        assert asked.id is not None
        assert [m.id for m in await store.get_history(SID)] == [asked.id]  # cached now

        with pytest.raises(StoreError):
            await store.append_marking(SID, _msg("回答", role="assistant"), asked.id, "bogus")  # type: ignore[arg-type]
        assert [m.content for m in await store.get_history(SID)] == ["问题"]
        assert await store.replies_being_sent() == []

        answer = await store.append_marking(SID, _msg("回答", role="assistant"), asked.id, "sending")
        assert answer.id is not None
        assert answer.id > asked.id
        assert await store.get_history(SID) == [asked, answer]
        assert await store.replies_being_sent() == [(SID, asked.id)]
    finally:
        await store.close()
    reopened = Store(location)
    await reopened.open()
    try:
        assert [m.content for m in await reopened.get_history(SID)] == ["问题", "回答"]
        assert await reopened.replies_being_sent() == [(SID, asked.id)]
    finally:
        await reopened.close()


async def test_archive_span_by_id_ranges_leaves_other_sessions_and_kept_ones_alone(store: Store) -> None:
    # Issue 9: the span is archived one id range per stretch between kept originals; another
    # session's messages inside those ranges stay active (R-RUN-12: kept ones are not written).
    mine, theirs = [], []
    for i in range(6):
        mine.append(await store.append(SID, _msg(f"[甲(1)] {i}", ts=float(i))))
        theirs.append(await store.append("onebot:group:456", _msg(f"[乙(2)] {i}", ts=float(i))))

    assert await store.archive_span(SID, 5, keep={0, 3}) == 3

    assert await store.get_history(SID) == [mine[0], mine[3], mine[5]]
    assert await store.get_archived(SID) == [mine[1], mine[2], mine[4]]
    assert await store.get_history("onebot:group:456") == theirs
    assert await store.count_active(SID) == 3
