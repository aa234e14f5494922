"""What only the PostgreSQL store has: its migrations (numbered as SQLite's, a newer schema
refused), several processes on one database (a history one process cached, written by
another; one compression per session through an advisory lock that dies with its
process), and MEMSUM_DB_URL (a bad URL or an unreachable server: one line, no password).

Every test runs on a real PostgreSQL server (tests/fakes/pgserver.py) in a fresh database.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest

from nonebot_plugin_memsum.config import parse_config
from nonebot_plugin_memsum.errors import ConfigError
from nonebot_plugin_memsum.store import SearchQuery, Store, StoreError, open_store
from nonebot_plugin_memsum.store.engine import lock_key
from nonebot_plugin_memsum.store.migrations import MIGRATIONS
from nonebot_plugin_memsum.store.postgres import PG_MIGRATIONS, migrate
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.pgdb import fresh_database, raw
from tests.fakes.pgserver import PgServer

SID = "onebot:10000:group:1"


@pytest.fixture
async def url(pg_server: PgServer) -> AsyncIterator[str]:
    """A fresh database with the schema (from the template)."""
    async with fresh_database(pg_server.url()) as fresh:
        yield fresh


@pytest.fixture
def blank(pg_url: str) -> str:
    """A fresh empty database."""
    return pg_url


def said(text: str, ts: float = 1.0) -> Message:
    return Message(role="user", content=f"[甲(20001)] {text}", name="20001", ts=ts)


# ---- migrations ---------------------------------------------------------------------------
def test_migrations_are_numbered_as_sqlites() -> None:
    # One version number means one schema on both engines (the migrate tool relies on it).
    assert len(PG_MIGRATIONS) == len(MIGRATIONS)
    assert [m.__name__ for m in PG_MIGRATIONS] == [m.__name__ for m in MIGRATIONS]


async def test_blank_to_latest_and_reopen_runs_nothing_again(blank: str) -> None:
    store = await open_store(blank)
    await store.close()
    assert await raw(blank, "SELECT version FROM memsum_schema") == [(len(PG_MIGRATIONS),)]
    tables = {r[0] for r in await raw(blank, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"sessions", "messages", "metadata", "settings", "ledger", "search_index", "replies"} <= tables
    store = await open_store(blank)  # already latest
    await store.close()
    assert await raw(blank, "SELECT COUNT(*) FROM memsum_schema") == [(1,)]


async def test_a_failed_migration_leaves_the_old_schema(blank: str) -> None:
    from nonebot_plugin_memsum.store.engine import PostgresDb

    store = await open_store(blank)
    await store.close()

    async def half_done(db: PostgresDb) -> None:
        await db.fetch("CREATE TABLE half (x INTEGER)")
        raise RuntimeError("boom")

    db = await PostgresDb.connect(blank)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            await migrate(db, (*PG_MIGRATIONS, half_done))
    finally:
        await db.close()
    assert await raw(blank, "SELECT version FROM memsum_schema") == [(len(PG_MIGRATIONS),)]
    assert await raw(blank, "SELECT tablename FROM pg_tables WHERE tablename = 'half'") == []


async def test_a_newer_database_is_refused_and_left_as_found(url: str) -> None:
    future = len(PG_MIGRATIONS) + 1
    await raw(url, "UPDATE memsum_schema SET version = ?", (future,))
    with pytest.raises(StoreError, match="newer") as caught:
        await open_store(url)
    assert f"schema version {future}" in str(caught.value)
    assert await raw(url, "SELECT version FROM memsum_schema") == [(future,)]


async def test_two_processes_starting_at_once_migrate_once(blank: str) -> None:
    stores = await asyncio.gather(*(open_store(blank) for _ in range(4)))
    for store in stores:
        await store.close()
    assert await raw(blank, "SELECT version FROM memsum_schema") == [(len(PG_MIGRATIONS),)]


# ---- several processes on one database ----------------------------------------------------
async def test_a_cached_history_shows_what_another_process_wrote(url: str) -> None:
    first, second = await open_store(url), await open_store(url)
    try:
        await first.append(SID, said("一"))
        assert [m.content for m in await first.get_history(SID)] == ["[甲(20001)] 一"]  # cached now
        await second.append(SID, said("二"))
        await first.append(SID, said("三"))
        assert [m.content for m in await first.get_history(SID)] == [
            "[甲(20001)] 一",
            "[甲(20001)] 二",
            "[甲(20001)] 三",
        ]
        await second.archive_span(SID, 2)  # another process compressed
        assert [m.content for m in await first.get_history(SID)] == ["[甲(20001)] 三"]
        await second.clear(SID, "context")
        assert await first.get_history(SID) == []
        assert await first.search(SearchQuery(SID, "三")) == []  # cleared for every process
        await second.append(SID, said("提取码 k2v8"))
        [hit] = await first.search(SearchQuery(SID, "提取码"))
        assert hit.message.content == "[甲(20001)] 提取码 k2v8"
    finally:
        await first.close()
        await second.close()


async def test_a_session_deleted_by_another_process_is_recorded_again(url: str) -> None:
    # The owner deletes a group's session on the second process's web page while the group
    # keeps talking to the first: the first process's next message stores the record again
    # (its settings' place layer and the web page's list need it), not only the message.
    record = SessionRecord(id=SID, platform="onebot", kind="group", place="group:1", room_class="room")
    first, second = await open_store(url), await open_store(url)
    try:
        await first.save_session(record)
        await first.append(SID, said("一"))
        await second.delete_session(SID)
        assert await second.get_session(SID) is None
        again = await first.save_session(record)
        await first.append(SID, said("二", ts=2.0))
        assert await second.get_session(SID) == again
        assert [m.content for m in await second.get_history(SID)] == ["[甲(20001)] 二"]
    finally:
        await first.close()
        await second.close()


async def test_r_run_11_the_commit_holds_the_session_against_other_processes(url: str) -> None:
    # The compression's re-read (`history_in`) holds the session's rows until COMMIT: a
    # write another process began waits, so what was re-read is what gets archived.
    first, second = await open_store(url), await open_store(url)
    try:
        await first.append(SID, said("一"))
        async with first.transaction() as tx:
            seen = await first.history_in(tx, SID)
            late = asyncio.create_task(second.append(SID, said("二")))
            waiting: list[tuple[object, ...]] = []
            for _ in range(400):  # until the second process waits on the lock
                waiting = await raw(
                    url,
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'",
                )
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert waiting
            assert not late.done()
            await tx.archive_span(SID, len(seen))
        await late
        assert [m.content for m in seen] == ["[甲(20001)] 一"]
        assert [m.content for m in await first.get_history(SID)] == ["[甲(20001)] 二"]  # not archived unseen
    finally:
        await first.close()
        await second.close()


async def test_one_holder_of_a_session_across_processes(url: str) -> None:
    first, second = await open_store(url), await open_store(url)
    try:
        async with first.exclusive(SID) as got:
            assert got
            async with second.exclusive(SID) as other:
                assert not other
            async with second.exclusive("onebot:10000:group:2") as elsewhere:
                assert elsewhere  # per session
            await second.append(SID, said("记录照常"))  # the lock holds off compressions, not writes
        async with second.exclusive(SID) as got_after:
            assert got_after
    finally:
        await first.close()
        await second.close()


async def test_the_lock_of_a_killed_process_is_freed(url: str) -> None:
    # A real second process takes the lock and is SIGKILLed: the server drops its
    # connection, and the lock with it, so no process waits for a dead one.
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import asyncio, asyncpg, sys\n"
        "async def main():\n"
        f"    c = await asyncpg.connect({url!r})\n"
        f"    assert await c.fetchval('SELECT pg_try_advisory_lock($1)', {lock_key('memsum:' + SID)})\n"
        "    print('held', flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n",
        stdout=asyncio.subprocess.PIPE,
    )
    store = await open_store(url)
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), 30) == b"held\n"
        async with store.exclusive(SID) as got:
            assert not got
        holder.kill()
        await holder.wait()
        for _ in range(200):  # the server notices the closed socket at once; be patient under load
            async with store.exclusive(SID) as got:
                if got:
                    break
            await asyncio.sleep(0.05)
        assert got
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await store.close()


async def test_a_lost_connection_is_made_again(url: str) -> None:
    store = await open_store(url)
    try:
        await store.append(SID, said("之前"))
        await raw(
            url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        for _ in range(200):  # terminating is a signal: wait until the backend is gone
            if not await raw(
                url,
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()",
            ):
                break
            await asyncio.sleep(0.05)
        # The call that meets the broken connection may fail (a StoreError, nothing half
        # written); the store connects again for the next one.
        try:
            await store.append(SID, said("断开时"))
            meanwhile = ["[甲(20001)] 断开时"]
        except StoreError:
            meanwhile = []
        await store.append(SID, said("之后"))
        assert [m.content for m in await store.get_history(SID)] == [
            "[甲(20001)] 之前",
            *meanwhile,
            "[甲(20001)] 之后",
        ]
    finally:
        await store.close()


async def test_a_message_with_a_nul_character_is_stored_not_lost(url: str) -> None:
    # PostgreSQL text refuses U+0000, which a SQLite file keeps: replaced, never dropped.
    store = await open_store(url)
    try:
        await store.append(SID, said("a\x00b"))
        assert [m.content for m in await store.get_history(SID)] == ["[甲(20001)] a\ufffdb"]
    finally:
        await store.close()


# ---- MEMSUM_DB_URL -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        "mysql://u:hunter2@h/db",
        "postgresql://u:hunter2@/db",
        "postgresql://u:hunter2@h:port/db",
        "postgresql://u:hunter2@h:5432/",
        "hunter2",
    ],
)
def test_a_bad_url_stops_start_up_naming_the_key_without_the_password(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"memsum_db_url": bad})
    line = str(caught.value)
    assert line.startswith("invalid MEMSUM_DB_URL")
    assert "postgresql://user:password@host:port/dbname" in line
    assert "hunter2" not in line
    assert "\n" not in line


def test_the_url_chooses_postgresql_and_empty_keeps_sqlite(tmp_path: object) -> None:
    from pathlib import Path

    default = Path("/data/memsum.db")
    assert parse_config({}).store_location(default) == default
    assert parse_config({"memsum_db_path": "x.db"}).store_location(default) == Path("x.db")
    url = "postgresql://u:pw@h:5432/db"
    assert parse_config({"memsum_db_url": url, "memsum_db_path": "x.db"}).store_location(default) == url
    assert "pw" not in repr(parse_config({"memsum_db_url": url}))


async def test_an_unreachable_server_is_one_error_without_the_password(pg_url: str) -> None:
    # A port nobody listens on (the test server's port + 1 is not it).
    with pytest.raises(StoreError) as caught:
        await open_store("postgresql://memsum:hunter2@127.0.0.1:1/memsum")
    assert "hunter2" not in str(caught.value)
    assert "postgresql://memsum@127.0.0.1:1/memsum" in str(caught.value)
    with pytest.raises(StoreError) as caught:
        await open_store(pg_url.rsplit("/", 1)[0] + "/no_such_database")
    assert "no_such_database" in str(caught.value)


async def test_a_store_reports_where_it_lives_without_the_password() -> None:
    store = Store("postgresql://memsum:hunter2@db.example:5433/memsum")
    assert str(store) == "postgresql://memsum@db.example:5433/memsum"
    assert store.shared
    with pytest.raises(StoreError, match="not open"):
        await store.get_history(SID)
    assert not isinstance(asyncpg, type(None))
