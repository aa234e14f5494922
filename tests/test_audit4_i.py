"""Fourth outside audit (i): several processes on one PostgreSQL memory, and the move from
SQLite (issue 13). Every test runs on the real server of tests/fakes/pgserver.py."""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from nonebot_plugin_memsum.compression.service import CLEARS_NAMESPACE
from nonebot_plugin_memsum.store import SearchQuery, Store, StoreError, open_store
from nonebot_plugin_memsum.store.migrate import MigrateError, migrate
from nonebot_plugin_memsum.store.store import Tx
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.pgdb import fresh_database, raw
from tests.fakes.pgserver import PgServer
from tests.fakes.service import GROUP as SERVICE_GROUP
from tests.fakes.service import Make, seed, summary_of

GROUP = SessionRecord(
    id="onebot:10000:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
)
SID = GROUP.id


@pytest.fixture
async def url(pg_server: PgServer) -> AsyncIterator[str]:
    async with fresh_database(pg_server.url()) as fresh:
        yield fresh


def said(text: str, ts: float = 1.0, name: str = "20001") -> Message:
    return Message(role="user", content=f"[甲({name})] {text}", name=name, ts=ts)


async def _sqlite_file(path: Path, messages: list[Message]) -> None:
    store = Store(path)
    await store.open()
    try:
        await store.save_session(GROUP)
        for msg in messages:
            await store.append(SID, msg)
    finally:
        await store.close()


async def test_a_sqlite_message_holding_a_nul_is_migrated_not_a_crash(tmp_path: Path, url: str) -> None:
    path = tmp_path / "memsum.db"
    await _sqlite_file(path, [said("前"), said("a\x00b 提取码", ts=2.0, name="2\x001"), said("后", ts=3.0)])
    # PostgreSQL text refuses U+0000, which the SQLite file kept: the copy stores U+FFFD, as
    # the PostgreSQL store itself does, and verifies; a rerun finds nothing to copy.
    report = await migrate(path, url)
    assert report.verified, report.lines()
    again = await migrate(path, url)
    assert again.verified, again.lines()
    assert {t.name: t.copied for t in again.tables}["messages"] == 0
    pg = await open_store(url)
    try:
        history = await pg.get_history(SID)
        assert [m.content for m in history] == [
            "[甲(20001)] 前",
            "[甲(2\ufffd1)] a\ufffdb 提取码",
            "[甲(20001)] 后",
        ]
        assert history[1].name == "2\ufffd1"
        [hit] = await pg.search(SearchQuery(SID, "提取码"))
        assert hit.message.id == history[1].id
    finally:
        await pg.close()


async def test_a_search_holding_a_nul_answers_not_a_store_error(url: str) -> None:
    store = await open_store(url)
    try:
        await store.append(SID, said("提取码 k2v8"))
        assert await store.search(SearchQuery(SID, "提取\x00码")) is not None
        assert await store.search(SearchQuery(SID, "提取码", speaker="甲\x00")) is not None
    finally:
        await store.close()


async def test_a_nul_in_a_summary_setting_answer_or_deduplicated_message_is_stored(url: str) -> None:
    store = await open_store(url)
    try:
        await store.put_meta("summary", SID, {"text": "a\x00b"})
        await store.set_setting("session", SID, "persona", "你\x00好")
        await store.append_marking(SID, Message(role="assistant", content="x\x00y", ts=2.0), 1, "sending")
        m = Message(role="user", content="q\x00", name="1", ts=3.0, platform_id="p1")
        assert await store.append_once(SID, m) is not None
        assert await store.append_once(SID, m) is None
        assert await store.get_meta("summary", SID) == {"text": "a\x00b"}  # JSON escapes it
        assert (await store.get_settings("session", SID))["persona"] == "你\x00好"
        assert [x.content for x in await store.get_history(SID)] == ["x\ufffdy", "q\ufffd"]
    finally:
        await store.close()


async def test_a_huge_paste_of_long_words_is_stored_and_found_on_postgresql(url: str) -> None:
    # 2,500 distinct 500-letter words (a pasted dump): its tsvector would pass PostgreSQL's
    # 1 MB limit, which refused the message itself; the text is stored whole, the head indexed.
    rng = random.Random(7)
    words = ["".join(rng.choices(string.ascii_lowercase, k=500)) for _ in range(2500)]
    store = await open_store(url)
    try:
        big = await store.append(SID, said(" ".join(words)))
        await store.append(SID, said("之后 提取码", ts=2.0))
        assert [m.content for m in await store.get_history(SID)] == [big.content, "[甲(20001)] 之后 提取码"]
        [hit] = await store.search(SearchQuery(SID, words[0]))
        assert hit.message.id == big.id
        [hit] = await store.search(SearchQuery(SID, "提取码"))
        assert hit.message.content == "[甲(20001)] 之后 提取码"
    finally:
        await store.close()


async def test_two_processes_recording_one_group_at_once_lose_nothing(url: str) -> None:
    # Two bot processes (two connections) record into one group session at the same time:
    # every message stored once, ids unique, each process's messages in the order it sent
    # them, and each process's (cached) history the same as the database's.
    first, second = await open_store(url), await open_store(url)
    try:
        await first.get_history(SID)
        await second.get_history(SID)  # both cached before the race

        async def record(store: Store, who: str, n: int) -> None:
            for i in range(n):
                await store.append(SID, said(f"{who}{i} 😀", ts=1.0 + i, name=who))

        await asyncio.gather(record(first, "1", 150), record(second, "2", 150))
        history = await first.get_history(SID)
        ids = [m.id or 0 for m in history]
        assert len(history) == 300
        assert ids == sorted(set(ids))  # unique, in arrival (id) order
        for who in ("1", "2"):
            mine = [m.content for m in history if m.name == who]
            assert mine == [f"[甲({who})] {who}{i} 😀" for i in range(150)]
        assert await second.get_history(SID) == history
        assert await raw(url, "SELECT active FROM message_counts WHERE session_id = ?", (SID,)) == [(300,)]
    finally:
        await first.close()
        await second.close()


async def _kill_other_backends(url: str) -> None:
    await raw(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    for _ in range(200):
        if not await raw(
            url,
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        ):
            return
        await asyncio.sleep(0.05)


async def test_a_connection_dropped_inside_a_commit_leaves_the_old_state_and_reconnects(url: str) -> None:
    store = await open_store(url)
    try:
        for i in range(4):
            await store.append(SID, said(f"第{i}句", ts=1.0 + i))

        async def commit() -> None:
            async with store.transaction() as tx:
                seen = await store.history_in(tx, SID)
                await tx.archive_span(SID, len(seen))
                await tx.put_meta("summary", SID, {"text": "新摘要"})
                await _kill_other_backends(url)  # the server ends the connection mid-commit
                await tx.append(SID, said("分隔", ts=9.0))

        with pytest.raises(StoreError):
            await commit()
        # Old state, whole: nothing archived, no summary; the next call connects again.
        assert [m.content for m in await store.get_history(SID)] == [f"[甲(20001)] 第{i}句" for i in range(4)]
        assert await store.get_meta("summary", SID) is None
        await store.append(SID, said("之后", ts=10.0))
        assert len(await store.get_history(SID)) == 5
    finally:
        await store.close()


async def test_a_server_refusing_connections_is_a_clear_error_then_recovers(
    pg_server: PgServer, url: str
) -> None:
    name = url.rsplit("/", 1)[1]
    password = urlsplit(url).password
    assert password
    store = await open_store(url)
    try:
        await store.append(SID, said("之前"))
        pg_server.psql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        try:
            await raw(
                pg_server.url(),
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ?",
                (name,),
            )
            await asyncio.sleep(0.3)
            failures = []
            for _ in range(2):
                with pytest.raises(StoreError) as caught:
                    await store.append(SID, said("断开时"))
                failures.append(str(caught.value))
            assert all(password not in f for f in failures)
            assert "cannot connect to postgresql://" in failures[-1]
        finally:
            pg_server.psql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        await store.append(SID, said("之后", ts=2.0))
        assert [m.content for m in await store.get_history(SID)] == ["[甲(20001)] 之前", "[甲(20001)] 之后"]
    finally:
        await store.close()


async def test_migrating_a_file_a_running_bot_writes_in_wal(tmp_path: Path, url: str) -> None:
    # The bot keeps the file open (WAL, not checkpointed) and records on between two runs:
    # the first copies every committed row, the second exactly the new ones; both verify.
    path = tmp_path / "memsum.db"
    bot = Store(path)
    await bot.open()
    try:
        await bot.save_session(GROUP)
        for i in range(40):
            await bot.append(SID, said(f"第{i}句", ts=1.0 + i))
        assert (path.parent / "memsum.db-wal").stat().st_size > 0
        first = await migrate(path, url)
        assert first.verified, first.lines()
        assert {t.name: (t.rows, t.copied) for t in first.tables}["messages"] == (40, 40)
        for i in range(40, 45):
            await bot.append(SID, said(f"第{i}句", ts=1.0 + i))
        second = await migrate(path, url)
        assert second.verified, second.lines()
        assert {t.name: (t.rows, t.copied) for t in second.tables}["messages"] == (45, 5)
        pg = await open_store(url)
        try:
            assert await pg.get_history(SID) == await bot.get_history(SID)
        finally:
            await pg.close()
    finally:
        await bot.close()


@pytest.mark.parametrize("case", ["wrong_password", "unknown_host", "newer_schema"])
async def test_bot_start_up_on_a_bad_database_is_one_line_naming_the_key_without_the_password(
    tmp_path_factory: pytest.TempPathFactory, url: str, case: str
) -> None:
    parts = urlsplit(url)
    secret = parts.password
    assert secret
    if case == "wrong_password":
        target = url.replace(f":{secret}@", ":wrong-hunter2@")
        secret = "wrong-hunter2"
    elif case == "unknown_host":
        target = url.replace(f"@{parts.hostname}:", "@no-such-host.invalid:")
    else:
        await raw(url, "UPDATE memsum_schema SET version = version + 1")
        target = url
    bot = BotProcess(tmp_path_factory.mktemp("pgbad"), env={"MEMSUM_DB_URL": target, "LOG_LEVEL": "INFO"})
    with pytest.raises(BotExitedError) as exited:
        async with bot:
            pass
    lines = [line for line in exited.value.log.splitlines() if "nonebot-plugin-memsum" in line]
    assert len(lines) == 1, lines
    assert "MEMSUM_DB_URL" in lines[0]
    assert ("newer" in lines[0]) == (case == "newer_schema")
    assert secret not in exited.value.log
    assert exited.value.returncode != 0


async def test_r_mem_3_a_summary_clear_in_another_process_during_the_commit_wins(
    url: str, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first process's compression is inside its commit (the session held, the clear mark
    # read) when the owner clears the summary on the second process's web page. As in one
    # process, the clear waits for the commit and then clears: once it has returned, no
    # summary is left, the new one included.
    first, second = await make(location=url), await make(location=url)
    await seed(first.rt, 6)
    get_meta = Tx.get_meta
    clearing: list[asyncio.Task[None]] = []
    reads: list[str] = []

    async def mark_read_then_clear(tx: Tx, namespace: str, key: str) -> Any:
        mark = await get_meta(tx, namespace, key)
        if namespace == CLEARS_NAMESPACE and tx._db is first.rt.store._db:
            reads.append(key)  # the run's start, before its summary request, then its commit
        if len(reads) == 3 and not clearing:
            clearing.append(asyncio.create_task(second.rt.compression.clear(SERVICE_GROUP.id, "summary")))
            for _ in range(100):  # until the clear is done, or waits for this commit
                waiting = await raw(
                    url,
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'",
                )
                if clearing[0].done() or waiting:
                    break
                await asyncio.sleep(0.05)
        return mark

    monkeypatch.setattr(Tx, "get_meta", mark_read_then_clear)
    assert (await first.rt.compression.compress(SERVICE_GROUP.id)).outcome == "done"
    await clearing[0]
    assert await summary_of(first.rt) is None
    assert await summary_of(second.rt) is None


async def test_a_rerun_after_the_bots_moved_to_postgresql_does_not_undo_their_work(
    tmp_path: Path, url: str
) -> None:
    # The owner migrated, started the bots on PostgreSQL (they compressed and talked on),
    # then ran the tool again: it must not turn the memory back to the file's (archived
    # messages active again, the new summary replaced by the old one).
    path = tmp_path / "memsum.db"
    await _sqlite_file(path, [said(f"第{i}句", ts=1.0 + i) for i in range(6)])
    bot = Store(path)
    await bot.open()
    try:
        await bot.put_meta("summary", SID, {"text": "旧摘要"})
    finally:
        await bot.close()
    assert (await migrate(path, url)).verified
    pg = await open_store(url)
    try:
        await pg.archive_span(SID, 4)
        await pg.put_meta("summary", SID, {"text": "新摘要"})
        await pg.append(SID, said("迁移之后", ts=100.0))
        before = await pg.get_history(SID)
    finally:
        await pg.close()
    with pytest.raises(MigrateError, match="nothing was written"):
        await migrate(path, url)
    pg = await open_store(url)
    try:
        assert await pg.get_history(SID) == before
        assert await pg.get_meta("summary", SID) == {"text": "新摘要"}
    finally:
        await pg.close()
