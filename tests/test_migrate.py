"""The move from SQLite to PostgreSQL (`python -m nonebot_plugin_memsum.migrate`, issue 13):
a SQLite file the plugin wrote itself (compressions, archived and kept rows, a cleared
session, settings, ledger, reply marks) copied into a real PostgreSQL database
(tests/fakes/pgserver.py), then read back through the PostgreSQL store: the same memory,
recall working at once, new ids after the copied ones. A second run copies nothing; a
run killed midway is finished by the next; a target holding another memory is refused
before anything is written; a bad argument or an unreachable server is one line with
no password and status 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, SearchQuery, Store, open_store
from nonebot_plugin_memsum.store.migrate import TABLES, MigrateError, migrate
from nonebot_plugin_memsum.types import CompressionRecord, Message, SessionRecord, ToolCall
from tests.fakes.pgdb import raw
from tests.fakes.pgserver import PASSWORD, PgServer
from tests.fakes.ports import free_port
from tests.fakes.service import GROUP, Env, seed

ROOT = Path(__file__).resolve().parents[1]
OTHER = SessionRecord(
    id="onebot:group:2", platform="onebot", kind="group", place="group:2", room_class="room"
)
CLEARED = SessionRecord(
    id="onebot:group:3", platform="onebot", kind="group", place="group:3", room_class="room"
)


async def _plugin_file(env: Env) -> Path:
    """A memory the plugin wrote through its own services: two compressions of one group
    (archived rows, a divider, a summary, run records), tool calls with metadata, a
    platform id and a question, another group with settings, a cleared group, the ledger."""
    rt = env.rt
    await seed(rt, 12)
    assert (await rt.compression.compress(GROUP.id)).outcome == "done"
    await seed(rt, 8, start=100)
    assert (await rt.compression.compress(GROUP.id)).outcome == "done"
    await rt.agent.record(GROUP, Message(role="user", content="[甲(20001)] 网盘提取码是 7kq2", ts=2000.0))
    await rt.store.append(
        GROUP.id,
        Message(
            role="assistant",
            content="",
            tool_calls=(ToolCall(id="c1", name="recall", arguments='{"query": "提取码"}'),),
            metadata={"visibleContent": "我查一下"},
            ts=2001.0,
        ),
    )
    await rt.agent.record(
        OTHER,
        Message(role="user", content="[乙(20002)] 周末爬山吗", ts=2002.0, platform_id="88", addressed=True),
    )
    await rt.store.mark_reply(OTHER.id, 1, "sending")
    await rt.store.set_setting("place", "onebot:group:2", "compress_at", 0.5)
    await rt.store.set_setting("session", OTHER.id, "persona", "你是爬山向导")
    await seed(rt, 5, record=CLEARED, start=200)
    await rt.compression.clear(CLEARED.id, "context")
    await seed(rt, 2, record=CLEARED, start=300)
    await rt.store.record_usage(GROUP.id, "chat", "test/chat", 1234, 56, 7)
    await rt.store.record_compression(CompressionRecord(OTHER.id, 3000.0, "error", "timeout", 900))
    await rt.store.flush_ledger()
    return rt.store.path


async def _table_rows(location: Path | str, name: str) -> int:
    return (await raw(location, f"SELECT COUNT(*) FROM {name}"))[0][0]


async def test_the_plugins_file_is_copied_whole_and_reads_the_same(env: Env, pg_url: str) -> None:
    path = await _plugin_file(env)
    report = await migrate(path, pg_url)
    assert report.verified, report.lines()
    by_name = {t.name: t for t in report.tables}
    assert {t.name for t in TABLES} | {"message_counts", "search_index"} == set(by_name)
    for table in TABLES:
        assert by_name[table.name].rows == await _table_rows(path, table.name) > 0, table.name
        assert by_name[table.name].copied == by_name[table.name].rows

    mine, pg = env.rt.store, await open_store(pg_url)
    try:
        for record in (GROUP, OTHER, CLEARED):
            sid = record.id
            assert await pg.get_history(sid) == await mine.get_history(sid)
            assert await pg.get_archived(sid) == await mine.get_archived(sid)
            assert await pg.get_meta(SUMMARY_NAMESPACE, sid) == await mine.get_meta(SUMMARY_NAMESPACE, sid)
            assert await pg.get_session(sid) == await mine.get_session(sid)
            assert await pg.compressions(sid) == await mine.compressions(sid)
            assert await pg.usage_totals(sid) == await mine.usage_totals(sid)
        summary = await pg.get_meta(SUMMARY_NAMESPACE, GROUP.id)
        assert summary is not None
        assert summary["text"]
        assert len(await pg.compressions(GROUP.id)) == 2
        assert any(m.tokens for m in await pg.get_archived(GROUP.id))  # token estimates kept
        assert await pg.all_settings() == await mine.all_settings()
        assert await pg.replies_being_sent() == await mine.replies_being_sent()
        assert await pg.pending_questions(0) == await mine.pending_questions(0)
        assert await pg.session_overview("chat") == await mine.session_overview("chat")
        # Recall works at once, archived rows included, and never finds what was cleared.
        for query in ("提取码", "第3句", "第203句", "第300句"):
            for sid in (GROUP.id, CLEARED.id):
                q = SearchQuery(sid, query)
                assert [h.message for h in await pg.search(q)] == [h.message for h in await mine.search(q)]
        assert await pg.search(SearchQuery(GROUP.id, "第3句"))  # an archived message
        assert not await pg.search(SearchQuery(CLEARED.id, "第203句"))  # cleared
        # A bot on the copy stores after the copied ids (the identity sequences moved).
        last = (await mine.get_history(GROUP.id))[-1].id
        assert last is not None
        new = await pg.append(GROUP.id, Message(role="user", content="[甲(20001)] 迁移之后", ts=4000.0))
        assert new.id is not None
        assert new.id > last
    finally:
        await pg.close()


async def test_a_second_run_copies_nothing_and_verifies_again(env: Env, pg_url: str) -> None:
    path = await _plugin_file(env)
    assert (await migrate(path, pg_url)).verified
    again = await migrate(path, pg_url)
    assert again.verified
    assert [(t.name, t.copied) for t in again.tables] == [(t.name, 0) for t in again.tables]
    assert await _table_rows(pg_url, "messages") == await _table_rows(path, "messages")
    # The file moved on (another message, a compression archived rows): the rerun brings
    # exactly that over.
    await seed(env.rt, 3, start=400)
    assert (await env.rt.compression.compress(GROUP.id)).outcome == "done"
    third = await migrate(path, pg_url)
    assert third.verified, third.lines()
    copied = {t.name: t.copied for t in third.tables}
    assert copied["compressions"] == 1
    assert 4 <= copied["messages"] < await _table_rows(path, "messages")


async def test_a_target_holding_another_memory_is_refused_untouched(env: Env, pg_url: str) -> None:
    path = await _plugin_file(env)
    other = await open_store(pg_url)
    try:
        await other.save_session(GROUP)
        for i in range(3):
            await other.append(
                GROUP.id, Message(role="user", content=f"[丙(30003)] 另一份记忆{i}", ts=1.0 + i)
            )
    finally:
        await other.close()
    before = await raw(pg_url, "SELECT id, content FROM messages ORDER BY id")
    with pytest.raises(MigrateError, match="another memory"):
        await migrate(path, pg_url)
    assert await raw(pg_url, "SELECT id, content FROM messages ORDER BY id") == before


async def _big_file(path: Path, n: int) -> None:
    store = Store(path)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.save_session(GROUP)
            for i in range(n):
                await tx.append(
                    GROUP.id, Message(role="user", content=f"[甲(20001)] 第{i}句 话题{i % 7}", ts=1.0 + i)
                )
        await store.archive_span(GROUP.id, n // 2, keep=[3])
        await store.put_meta(SUMMARY_NAMESPACE, GROUP.id, {"text": "## 摘要", "time": 5.0})
    finally:
        await store.close()


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nonebot_plugin_memsum.migrate", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_a_run_killed_midway_is_finished_by_the_next(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "memsum.db"
    total = 6000
    await _big_file(path, total)
    # Small chunks: many transactions, so the kill lands between two of them.
    proc = _cli("--from", f"sqlite:{path}", "--to", pg_url, "--chunk", "50")
    try:
        for _ in range(3000):
            with contextlib.suppress(asyncpg.UndefinedTableError):  # not migrated yet
                if await _table_rows(pg_url, "messages"):
                    break
            await asyncio.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # mid-copy: whole chunks stay, the rest is missing
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    copied = await _table_rows(pg_url, "messages")
    assert 0 < copied < total
    assert copied % 50 == 0  # whole chunks only: each is one transaction
    report = await migrate(path, pg_url)
    assert report.verified, report.lines()
    messages = next(t for t in report.tables if t.name == "messages")
    assert (messages.rows, messages.copied) == (total, total - copied)
    pg = await open_store(pg_url)
    try:
        history = await pg.get_history(GROUP.id)
        assert [m.content for m in history][:2] == [
            "[甲(20001)] 第3句 话题3",
            f"[甲(20001)] 第{total // 2}句 话题{total // 2 % 7}",
        ]
        assert len(await pg.search(SearchQuery(GROUP.id, f"第{total - 1}句"))) == 1
    finally:
        await pg.close()


async def test_the_command_copies_verifies_and_reports(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "memsum.db"
    await _big_file(path, 40)
    proc = _cli("--from", f"sqlite:{path}", "--to", pg_url)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert PASSWORD not in out + err
    assert "verified" in out
    assert any(line.split()[:3] == ["messages", "40", "40"] for line in out.splitlines())
    proc = _cli("--from", f"sqlite:{path}", "--to", pg_url)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert any(line.split()[:3] == ["messages", "40", "0"] for line in out.splitlines())


@pytest.mark.parametrize(
    ("source", "target", "says"),
    [
        ("memsum.db", "{url}", "--from must be sqlite:PATH"),
        ("sqlite:{missing}", "{url}", "no such file"),
        ("sqlite:{file}", "mysql://memsum:{pw}@127.0.0.1/x", "--to must look like postgresql://"),
        ("sqlite:{file}", "postgresql://memsum:{pw}@127.0.0.1:port/x", "port is not a number"),
        (
            "sqlite:{file}",
            "postgresql://memsum:{pw}@127.0.0.1:{closed}/x",
            "cannot connect to postgresql://memsum@",
        ),
        ("sqlite:{file}", "{wrong_pw}", "cannot connect"),
    ],
)
async def test_a_bad_argument_or_unreachable_server_is_one_line_without_the_password(
    tmp_path: Path, pg_server: PgServer, source: str, target: str, says: str
) -> None:
    path = tmp_path / "memsum.db"
    await _big_file(path, 10)
    closed = free_port()  # nothing listens there
    fields = {
        "url": pg_server.url(),
        "missing": tmp_path / "none.db",
        "file": path,
        "pw": PASSWORD,
        "closed": closed,
        "wrong_pw": pg_server.url().replace(PASSWORD, "not-the-" + PASSWORD),
    }
    proc = _cli("--from", source.format(**fields), "--to", target.format(**fields))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert says in lines[0]
    assert PASSWORD not in out + err
