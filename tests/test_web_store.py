"""The store queries behind the web page, on both engines: the compression history,
the message counts the triggers keep (also after migrating an older SQLite file), the
ledger by day, and each session's last chat call."""

from __future__ import annotations

from pathlib import Path

import aiosqlite

from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.store.migrations import MIGRATIONS, _m005_compressions, migrate
from nonebot_plugin_memsum.types import CompressionRecord, Message, SessionRecord
from tests.fakes.pgdb import raw

MIDNIGHT = 1796227200.0
"""2026-12-03 00:00 in UTC+8."""


async def _counts(location: Path | str) -> dict[str, tuple[int, int]]:
    rows = await raw(location, "SELECT session_id, active, archived FROM message_counts")
    return {sid: (int(a), int(b)) for sid, a, b in rows}


async def _counted_by_hand(location: Path | str) -> dict[str, tuple[int, int]]:
    rows = await raw(
        location,
        "SELECT session_id, SUM(CASE WHEN archived = 0 AND event_marker = 0 AND role != 'system'"
        " THEN 1 ELSE 0 END), SUM(archived) FROM messages GROUP BY session_id",
    )
    return {sid: (int(a), int(b)) for sid, a, b in rows}


async def test_message_counts_follow_append_archive_clear_and_delete(location: Path | str) -> None:
    store = Store(location)
    await store.open()
    try:
        for i in range(6):
            await store.append("a", Message(role="user", content=f"[甲(1)] {i}", ts=100.0 + i))
        await store.append("a", Message(role="system", content="对话已压缩", event_marker=True, ts=200.0))
        await store.append("a", Message(role="notice", content="[乙(2)] 加入了群", ts=201.0))
        await store.append("b", Message(role="assistant", content="好的", ts=300.0))
        assert await _counts(location) == {"a": (7, 0), "b": (1, 0)} == await _counted_by_hand(location)
        assert await store.count_active("a") == 7  # the same rule as R-TRIG-4's count
        # A compression's archive span keeps the kept originals active (R-RUN-12).
        assert await store.archive_span("a", 7, keep=[1]) == 6
        assert (await _counts(location))["a"] == (2, 6) == (await _counted_by_hand(location))["a"]
        await store.clear("a", "context")
        assert await _counts(location) == {"a": (0, 8), "b": (1, 0)} == await _counted_by_hand(location)
        # A delete behind the store's back (another process's delete_session).
        await raw(location, "DELETE FROM messages WHERE session_id = 'b'")
        assert (await _counts(location))["b"] == (0, 0)
        (activity,) = await store.session_overview("对话")
        assert (activity.session_id, activity.active, activity.archived, activity.last_ts) == (
            "a",
            0,
            8,
            201.0,
        )
    finally:
        await store.close()


async def test_migration_counts_the_messages_of_an_older_file(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with aiosqlite.connect(path, isolation_level=None) as db:
        # The file as the version before the web page left it.
        await migrate(db, MIGRATIONS[: MIGRATIONS.index(_m005_compressions)])
        await db.executemany(
            "INSERT INTO messages (session_id, role, content, ts, event_marker, archived)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                ("g", "user", "x", 1.0, 0, 1),
                ("g", "system", "对话已压缩", 2.0, 1, 0),
                ("g", "user", "y", 3.0, 0, 0),
                ("p", "assistant", "z", 4.0, 0, 0),
            ],
        )
    store = Store(path)
    await store.open()
    try:
        assert await _counts(path) == {"g": (1, 1), "p": (1, 0)}
        await store.append("g", Message(role="user", content="新的一句", ts=5.0))
        assert (await _counts(path))["g"] == (2, 1)
    finally:
        await store.close()


async def test_compression_history_newest_first_and_last_per_session(location: Path | str) -> None:
    store = Store(location)
    await store.open()
    try:
        runs = [
            CompressionRecord("g", 1.0, "done", None, 900, 100, 2, 30, 1, 640),
            CompressionRecord("g", 2.0, "error", "摘要模型出错：超时", None, None, 0, 0, 3, 640),
            CompressionRecord("p", 3.0, "done", None, 500, 50, 0, 10, 2, None),
        ]
        for run in runs:
            await store.record_compression(run)
        assert await store.compressions("g") == [runs[1], runs[0]]
        assert await store.compressions("g", limit=1) == [runs[1]]
        assert await store.last_compressions() == {"g": runs[1], "p": runs[2]}
    finally:
        await store.close()


async def test_usage_rows_by_local_day_and_the_last_chat_call(location: Path | str) -> None:
    store = Store(location)
    await store.open()
    try:
        await store.save_session(SessionRecord(id="g", platform="onebot", kind="group", place="group:1"))
        await store.append("g", Message(role="user", content="[甲(1)] 你好", ts=1.0))
        # 2026-12-02 23:00 and 2026-12-03 01:00 in UTC+8, a summary call, a call of no session.
        for row in [
            ("g", "对话", "m/chat", 100, 10, 0, MIDNIGHT - 3600),
            ("g", "对话", "m/chat", 200, 20, 150, MIDNIGHT + 3600),
            ("g", "摘要", "m/sum", 900, 90, 0, MIDNIGHT + 7200),
            (None, "对话", "m/chat", 5, 1, 0, MIDNIGHT + 7200),
        ]:
            await raw(
                location,
                "INSERT INTO ledger (session_id, purpose, model, tokens_in, tokens_out, tokens_cached, ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )
        rows = await store.usage_by_day(utc_offset=8 * 3600)
        assert [
            (r.day, r.model, r.purpose, r.calls, r.tokens_in, r.tokens_out, r.tokens_cached) for r in rows
        ] == [
            ("2026-12-02", "m/chat", "对话", 1, 100, 10, 0),
            ("2026-12-03", "m/chat", "对话", 2, 205, 21, 150),
            ("2026-12-03", "m/sum", "摘要", 1, 900, 90, 0),
        ]
        assert [r.tokens_in for r in await store.usage_by_day(since=MIDNIGHT, session_id="g")] == [200, 900]
        (activity,) = await store.session_overview("对话")
        assert (activity.usage, activity.usage_model) == (
            200,
            "m/chat",
        )  # the last chat call, not the summary
        assert activity.record is not None
        assert activity.record.place == "group:1"
        assert await store.usage_series("g", "对话") == [
            (MIDNIGHT - 3600, 100),
            (MIDNIGHT + 3600, 200),
        ]
    finally:
        await store.close()
