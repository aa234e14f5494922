"""SQLite: a message's write on the event loop's thread (store/engine.py, `SqliteDb._write`).

Issue 9 (cheap turns): every message recorded was a trip to aiosqlite's thread, whose
wake-ups cost about as much CPU as SQLite's own insert; when the connection is idle the
write now runs where the caller is. These tests hold the cases where it must not: another
process holding the file's write lock (the loop must keep running while we wait for it),
a call still running in aiosqlite's thread after its task was cancelled (the write must not
overtake it), and the WAL's checkpoints, which SQLite no longer runs by itself.
All on real files, read back with a second plain connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.fakes.e2e import write_lock_held

if TYPE_CHECKING:
    from nonebot_plugin_memsum.store import Store
    from nonebot_plugin_memsum.store.engine import SqliteDb

SID = "onebot:group:123"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    from nonebot_plugin_memsum.store import Store

    s = Store(tmp_path / "memsum.db")
    await s.open()
    yield s
    await s.close()


def _db(store: Store) -> SqliteDb:
    from nonebot_plugin_memsum.store.engine import SqliteDb

    db = store._db
    assert isinstance(db, SqliteDb)
    return db


def _contents(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT content FROM messages ORDER BY id")]
    finally:
        conn.close()


async def _append(store: Store, text: str) -> int:
    from nonebot_plugin_memsum.types import Message

    stored = await store.append(SID, Message(role="user", content=text, ts=1.0))
    assert stored.id is not None
    return stored.id


async def test_an_idle_connection_writes_a_message_without_a_trip_to_its_thread(
    store: Store, tmp_path: Path
) -> None:
    await _append(store, "warm")  # the first call reads the schema's counters
    db = _db(store)
    sent = db._sent
    await _append(store, "一条消息")
    assert db._sent == sent  # nothing was handed to aiosqlite's thread
    assert _contents(tmp_path / "memsum.db") == ["warm", "一条消息"]  # on disk, committed


async def test_while_another_process_holds_the_write_lock_the_loop_keeps_running(
    store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "memsum.db"
    async with write_lock_held(path) as release:

        async def ten_ticks() -> None:
            for _ in range(10):
                await asyncio.sleep(0.01)

        writing = asyncio.create_task(_append(store, "等锁的消息"))
        # The write waits for the lock in aiosqlite's thread and the event loop goes on; a
        # write waiting on the loop would block it for the 5 s busy timeout, past this bound.
        await asyncio.wait_for(ten_ticks(), timeout=4)
        assert not writing.done()
        await release()
        await writing
    assert _contents(path) == ["等锁的消息"]
    await _append(store, "之后")  # and the next write takes the loop's path again
    assert _contents(path) == ["等锁的消息", "之后"]


async def test_a_write_does_not_overtake_a_call_still_running_in_the_thread(store: Store) -> None:
    db = _db(store)
    release = threading.Event()
    started = threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(10)
        conn.execute(
            "INSERT INTO messages (session_id, role, content, ts) VALUES (?, 'user', '先来的', 1.0)", (SID,)
        )

    # A call whose awaiting task is cancelled goes on in aiosqlite's thread.
    running = asyncio.create_task(db._call(slow, "write"))
    await asyncio.to_thread(started.wait, 10)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    writing = asyncio.create_task(_append(store, "后到的"))
    await asyncio.sleep(0.05)
    assert not writing.done()  # queued behind the running call, not run beside it
    release.set()
    later = await writing
    rows = await store.get_history(SID)
    assert [m.content for m in rows] == ["先来的", "后到的"]
    assert rows[-1].id == later


async def test_the_wal_is_checkpointed_while_messages_are_written(store: Store, tmp_path: Path) -> None:
    from nonebot_plugin_memsum.store.engine import CHECKPOINT_EVERY

    wal = tmp_path / "memsum.db-wal"
    sizes = []
    for round_ in range(6):
        for i in range(CHECKPOINT_EVERY):
            await _append(store, f"第 {round_} 轮的第 {i} 条消息，" + "内容" * 20)
        sizes.append(wal.stat().st_size)
    # Checkpointed every CHECKPOINT_EVERY writes, the WAL is reused from its start: it stops
    # growing after the first rounds (never checkpointed, it would hold all six rounds).
    assert sizes[0] > 0
    assert sizes[-1] <= 1.5 * sizes[1]
    assert len(_contents(tmp_path / "memsum.db")) == 6 * CHECKPOINT_EVERY
